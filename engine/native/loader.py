"""Native CPU kernels, compiled once per machine with torch's C++ extension builder.

Three kinds of kernels live in `csrc/`: paged decode attention, which reads
K/V in place through the block table instead of gathering a padded copy; the
layer's elementwise ops (RMSNorm with its residual add, rotary embedding,
SiLU-and-multiply, the KV cache write), each one pass where PyTorch needs
several ops; and linear layers over weights packed once at load (float32),
streamed once for a few rows (bfloat16), or kept in a GGUF file's quantized
blocks and widened in registers (`engine.quantized_weight`). Compilation takes
~1 min on 2 cores the first time (the kernel files include only the parts of
torch they use: `csrc/tensor_api.h`) and is cached
(TORCH_EXTENSIONS_DIR, default ~/.cache/torch_extensions). If it cannot be
built (no compiler, TANDEM_CPU_KERNELS=0), the engine falls back to the
PyTorch path and says so once.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import time
from pathlib import Path

from engine.cpu_features import cpu_features

logger = logging.getLogger("tandem.engine")

_CSRC = Path(__file__).parent / "csrc"
_SOURCES = [_CSRC / name for name in (
    "bindings.cpp", "paged_decode.cpp", "paged_prefill.cpp", "layer_ops.cpp", "small_linear.cpp", "packed_linear.cpp",
    "quantized_linear.cpp", "quantized_panels.cpp",
)]
_HEADERS = [_CSRC / name for name in (
    "tensor_api.h", "float_types.h", "online_softmax.h", "prefill_tasks.h", "paged_prefill_bf16dot.h", "gguf_blocks.h",
)]
_FLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-ffast-math", "-fopenmp"]
# /proc/cpuinfo flag -> GCC's name, to build without what TANDEM_CPU_MAX_ISA hides (-mno-avx512f also
# turns off every AVX-512 subset, -mno-amx-tile every AMX unit).
_GCC_EXTENSION = {"avx512f": "avx512f", "avx512_bf16": "avx512bf16", "amx_tile": "amx-tile", "amx_bf16": "amx-bf16"}


def compile_flags() -> list[str]:
    """-march=native, less the extensions `cpu_features()` hides."""
    hidden = cpu_features().hidden
    return _FLAGS + [f"-mno-{gcc}" for flag, gcc in _GCC_EXTENSION.items() if flag in hidden]


def native_kernels_enabled() -> bool:
    return os.environ.get("TANDEM_CPU_KERNELS", "1").strip().lower() not in ("0", "false", "no", "off")


def kernel_source_id() -> str:
    """What the native kernels a process would load are: a name hashed from their sources, flags and CPU
    ("none" when they are turned off). Measurements that depend on the kernels key on it."""
    return _module_name() if native_kernels_enabled() else "none"


@functools.cache
def load_cpu_kernels():
    """The compiled extension module, or None when it is disabled or cannot be built."""
    if not native_kernels_enabled():
        return None
    try:
        from torch.utils.cpp_extension import load

        logger.info("loading native CPU kernels (compiled on first use, ~1 min; cached afterwards)")
        wait_out_build_lock(_build_directory(_module_name()))
        sources = [str(s) for s in _SOURCES]
        module = load(_module_name(), sources, extra_cflags=compile_flags(), extra_ldflags=["-fopenmp"])
    except Exception as err:  # a missing compiler or ninja shows up as many exception types
        logger.warning("native CPU kernels unavailable (%s); using the PyTorch path", err)
        return None
    logger.info("native CPU kernels built for %s", " ".join(module.built_with()) or "the baseline x86-64")
    return module


# A build takes about a minute on 2 cores (several on a loaded machine), writing an object file into its directory
# every 10-50 s; a lock with nothing in that directory written for this long was left by a build that was killed.
STALE_LOCK_S = 10 * 60


def wait_out_build_lock(build_dir: str | Path, max_idle_s: float = STALE_LOCK_S, poll_s: float = 1.0) -> bool:
    """Wait while another process builds the kernels (its lock file exists); when its build has gone idle
    for `max_idle_s` (killed: a Ray worker of a stopped `tandem serve`), remove the lock. True if removed.

    torch's extension builder waits on that file forever, so one interrupted build would otherwise hang
    every later process that loads the kernels, without a word."""
    lock, said = Path(build_dir) / "lock", False
    while True:
        idle = _idle_s(lock)
        if idle is None:
            return False  # no lock, or it went: the build is there (or ours to make)
        if idle >= max_idle_s:
            logger.warning("removing a stale native-kernel build lock (%s: nothing built for %.0f s)", lock, idle)
            lock.unlink(missing_ok=True)
            return True
        if not said:
            logger.info("another process is building the native kernels (%s); waiting for it", lock.parent)
            said = True
        time.sleep(poll_s)


def _idle_s(lock: Path) -> float | None:
    """Seconds since the lock or anything beside it was last written; None without a lock."""
    try:
        newest = max(entry.stat().st_mtime for entry in [lock, *lock.parent.iterdir()])
    except FileNotFoundError:  # the lock (or a file being listed) went meanwhile: look again next time
        return None if not lock.exists() else 0.0
    return time.time() - newest


def _build_directory(name: str) -> str:
    from torch.utils.cpp_extension import _get_build_directory

    return _get_build_directory(name, verbose=False)


def _module_name() -> str:
    # Named by a hash of the sources, their directory and the flags: two checkouts (or
    # versions) never share a build directory in the extensions cache. The directory counts
    # because the build commands name the sources by path: two checkouts of the same sources
    # under one name would make each build look stale to the other, rebuilt on every load.
    # The CPU counts too (the build is for its instruction set: -march=native), so a cache shared between
    # machines never hands an AVX-512 build to an AVX2-only CPU.
    digest = hashlib.blake2b(" ".join([*compile_flags(), str(_CSRC.resolve()), cpu_features().signature()]).encode(),
                             digest_size=6)
    for source in _SOURCES + _HEADERS:
        digest.update(source.read_bytes())
    return f"tandem_cpu_kernels_{digest.hexdigest()}"
