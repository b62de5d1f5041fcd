"""Attention over the paged KV cache, behind one call that the model code uses.

`attention_backend` picks the implementation:
- "torch": plain PyTorch (SDPA over gathered K/V), the reference for every kernel;
- "cpu": the PyTorch path with decode attention in a native C++ kernel that reads
  the paged cache in place (compiled once per machine);
- "triton": GPU kernels, added beside their PyTorch references;
- "auto": Triton on CUDA; on CPU "cpu" when its kernel builds, else "torch".
Every backend has the signature of `torch_backend.paged_attention`.
"""

import logging

from engine.attention.metadata import AttentionMetadata
from engine.attention.torch_backend import paged_attention as torch_paged_attention

logger = logging.getLogger("tandem.engine")

BACKENDS = ("auto", "torch", "cpu", "triton")


def select_backend(name: str, device: str):
    """Return the attention function for a backend name."""
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; use one of {', '.join(BACKENDS)}")
    if name == "auto":
        name = "triton" if device.startswith("cuda") else "cpu"
    if name == "triton":
        raise ValueError("attention_backend='triton' is not available yet; use 'torch', 'cpu' or 'auto'")
    if name == "cpu":
        return _cpu_backend(device)
    return torch_paged_attention


def _cpu_backend(device: str):
    from engine.attention.cpu_backend import make_cpu_paged_attention
    from engine.native import load_cpu_kernels

    kernels = load_cpu_kernels() if device == "cpu" else None
    if kernels is None:
        logger.info("attention backend: torch (native CPU kernels not available)")
        return torch_paged_attention
    return make_cpu_paged_attention(kernels)


__all__ = ["AttentionMetadata", "BACKENDS", "select_backend"]
