"""What the CPU at hand is and which vector extensions it has: what kernel and dtype choices depend on.

Read from /proc/cpuinfo (Linux); elsewhere the model is unknown and no extension is assumed, so every
choice falls back to what runs everywhere (float32, the portable kernels).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

# The extensions a kernel or dtype choice looks at, in the order a signature lists them.
WATCHED = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")


@dataclass(frozen=True)
class CPUFeatures:
    model: str
    flags: frozenset[str]

    @property
    def native_bf16(self) -> bool:
        """bfloat16 dot products in hardware (AVX512-BF16 or AMX): bf16 runs faster than float32; without
        them it is emulated and several times slower."""
        return bool({"avx512_bf16", "amx_bf16"} & self.flags)

    def signature(self) -> str:
        """The model and the watched extensions it has, e.g. "AMD EPYC [avx2 fma avx512f avx512_bf16]"."""
        return f"{self.model} [{' '.join(f for f in WATCHED if f in self.flags)}]"


@functools.cache
def cpu_features(cpuinfo: str = "/proc/cpuinfo") -> CPUFeatures:
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
