"""Native CPU kernels, compiled once per machine with torch's C++ extension builder.

The paged decode attention kernel reads K/V in place through the block table
instead of gathering them into a padded copy first, which is most of the
decode step's attention time in the PyTorch path. Compilation takes ~30 s the
first time and is cached (TORCH_EXTENSIONS_DIR, default ~/.cache/torch_extensions).
If it cannot be built (no compiler, TANDEM_CPU_KERNELS=0), the engine falls back
to the PyTorch path and says so once.
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

logger = logging.getLogger("tandem.engine")

_SOURCE = Path(__file__).parent / "csrc" / "paged_decode.cpp"
_FLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp"]


@functools.cache
def load_cpu_kernels():
    """The compiled extension module, or None when it is disabled or cannot be built."""
    if os.environ.get("TANDEM_CPU_KERNELS", "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    try:
        from torch.utils.cpp_extension import load

        logger.info("loading native CPU kernels (compiled on first use, ~30 s; cached afterwards)")
        return load("tandem_cpu_kernels", [str(_SOURCE)], extra_cflags=_FLAGS, extra_ldflags=["-fopenmp"])
    except Exception as err:  # a missing compiler or ninja shows up as many exception types
        logger.warning("native CPU kernels unavailable (%s); using the PyTorch attention path", err)
        return None
