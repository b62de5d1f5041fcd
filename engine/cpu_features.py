"""What the CPU at hand is and which vector extensions it has: what kernel and dtype choices depend on.

Read from /proc/cpuinfo (Linux); elsewhere the model is unknown and no extension is assumed, so every
choice falls back to what runs everywhere (float32, the portable kernels).

`TANDEM_CPU_MAX_ISA` (avx2 | avx512 | native, the default) hides the extensions above a level, as
oneDNN's ONEDNN_MAX_CPU_ISA and ATen's ATEN_CPU_CAPABILITY do for theirs: the native kernels are then
built without them and dtype "auto" chooses as on such a CPU. It serves to run and test the path an
older CPU takes (an AVX2-only EPYC) on a newer one, or to build one kernel set for a mixed fleet.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

# The extensions a kernel or dtype choice looks at, in the order a signature lists them.
WATCHED = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")
# TANDEM_CPU_MAX_ISA -> the flag prefixes it hides (every AVX-512 subset goes with avx512f, every AMX
# unit with amx_tile, as with GCC's -mno-avx512f / -mno-amx-tile).
ISA_CAPS = {"avx2": ("avx512", "amx"), "avx512": ("avx512_bf16", "avx512_fp16", "amx"), "native": ()}


@dataclass(frozen=True)
class CPUFeatures:
    model: str
    flags: frozenset[str]
    hidden: frozenset[str] = frozenset()  # what the CPU has that TANDEM_CPU_MAX_ISA hides

    @property
    def native_bf16(self) -> bool:
        """bfloat16 dot products in hardware (AVX512-BF16 or AMX): bf16 runs faster than float32; without
        them it is emulated and several times slower."""
        return bool({"avx512_bf16", "amx_bf16"} & self.flags)

    def signature(self) -> str:
        """The model and the watched extensions it has, e.g. "AMD EPYC [avx2 fma avx512f avx512_bf16]"."""
        has = f"{self.model} [{' '.join(f for f in WATCHED if f in self.flags)}]"
        hidden = [f for f in WATCHED if f in self.hidden]
        return f"{has} (hidden: {' '.join(hidden)})" if hidden else has


@functools.cache
def cpu_features(cpuinfo: str = "/proc/cpuinfo") -> CPUFeatures:
    """What the kernels and dtype choices may use: the CPU's extensions under TANDEM_CPU_MAX_ISA."""
    return capped(read_cpuinfo(cpuinfo), max_isa())


def max_isa() -> str:
    """TANDEM_CPU_MAX_ISA as a level name ("native" when unset)."""
    return os.environ.get("TANDEM_CPU_MAX_ISA", "").strip().lower() or "native"


def capped(features: CPUFeatures, cap: str) -> CPUFeatures:
    level = cap.strip().lower() or "native"
    if level not in ISA_CAPS:
        raise ValueError(f"TANDEM_CPU_MAX_ISA={cap!r}: expected one of {', '.join(ISA_CAPS)}")
    hidden = frozenset(f for f in features.flags if f.startswith(ISA_CAPS[level]))  # startswith(()): none
    return CPUFeatures(features.model, features.flags - hidden, features.hidden | hidden)


def read_cpuinfo(cpuinfo: str = "/proc/cpuinfo") -> CPUFeatures:
    model, flags = "unknown CPU", frozenset()
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = frozenset(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    return CPUFeatures(model, flags)
