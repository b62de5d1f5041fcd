"""The peer (vLLM) runs the kernels it would choose on the CPU that `TANDEM_CPU_MAX_ISA` plays.

`TANDEM_CPU_MAX_ISA=avx2` plays an AVX2-only CPU on an AVX-512 one. Tandem's native kernels follow it, and
ATen, oneDNN and MKL follow their own caps (`ATEN_CPU_CAPABILITY`, `ONEDNN_MAX_CPU_ISA`,
`MKL_ENABLE_INSTRUCTIONS`). vLLM's CPU build does not: it loads one of its three compiled kernel libraries
(`_C_AVX2`, `_C_AVX512`, or `_C` for AVX512-BF16) by asking `torch.cpu._is_avx512_supported()` and its
siblings, which read the CPU itself. Left alone, the played AVX2 machine would run vLLM's AVX-512
attention, which a real one cannot. `peer_site/sitecustomize.py`, put on the peer's PYTHONPATH, makes those
questions answer as the played CPU would, so vLLM picks what it picks there.
"""

from __future__ import annotations

from pathlib import Path

from engine.cpu_features import max_isa

SITE_DIR = Path(__file__).with_name("peer_site")
LEVEL_VARIABLE = "TANDEM_PEER_MAX_ISA"  # read by peer_site/sitecustomize.py, in the peer's interpreter


def peer_isa_env(env: dict[str, str]) -> dict[str, str]:
    """`env` for a peer process: unchanged at the native level, else with the site hook and the level
    (the hook's directory replaces PYTHONPATH: nothing of Tandem's tree may shadow the peer's packages)."""
    level = max_isa()
    if level == "native":
        return env
    return {**env, "PYTHONPATH": str(SITE_DIR), LEVEL_VARIABLE: level}
