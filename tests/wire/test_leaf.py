"""`wire` is a leaf: every process imports it, so it pulls in no torch and no other Tandem package."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import wire

TANDEM_PACKAGES = ("engine", "kvtransfer", "runtime", "router", "cluster", "prefill_worker", "decode_worker")


def test_wire_imports_neither_torch_nor_another_tandem_package():
    modules = sorted(f"wire.{p.stem}" for p in pathlib.Path(wire.__file__).parent.glob("*.py") if p.stem != "__init__")
    script = (
        f"import sys\nfor m in {modules!r}: __import__(m)\n"
        f"loaded = sorted(n for n in sys.modules if n.split('.')[0] in {('torch', *TANDEM_PACKAGES)!r})\n"
        "print(loaded)"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         cwd=pathlib.Path(wire.__file__).parent.parent)  # fmt: skip
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
    assert len(modules) >= 8
