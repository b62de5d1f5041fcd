"""Make named packages unimportable, as on the GPU machine's image, to prove a check needs none of them.

The image holds PyTorch, Triton, transformers, msgpack, uvloop, numpy, safetensors and pytest, not Ray,
pyzmq, FastAPI, xgrammar or gguf. `scripts/gpu_check.py --without ray,zmq,...` puts the names in
TANDEM_CHECK_WITHOUT; every step process starts through `device_check.launch`, which installs this
finder first, so an import of any of them fails there as it would on the image. One difference:
`importlib.util.find_spec` of a blocked name raises ModuleNotFoundError where an absent one gives None.
"""

from __future__ import annotations

import os
import sys

ENV = "TANDEM_CHECK_WITHOUT"


class BlockedImports:
    """A meta path finder that refuses the named top-level packages and everything under them."""

    def __init__(self, names: set[str]):
        self.names = names

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {fullname!r} (blocked by {ENV})", name=fullname)
        return None  # not ours: the next finder looks


def install_from_env() -> set[str]:
    """Block what TANDEM_CHECK_WITHOUT names (comma-separated); returns the names."""
    names = {n.strip() for n in os.environ.get(ENV, "").split(",") if n.strip()}
    if names:
        already = sorted(n for n in names if n in sys.modules)
        if already:
            raise RuntimeError(f"{', '.join(already)} imported before {ENV} could block it")
        sys.meta_path.insert(0, BlockedImports(names))
    return names
