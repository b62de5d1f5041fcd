"""Attention over the paged KV cache, behind one call that the model code uses.

`attention_backend` picks the implementation:
- "torch": plain PyTorch (SDPA over gathered K/V), the reference for every kernel;
- "cpu": the PyTorch path with decode attention in a native C++ kernel that reads
  the paged cache in place (compiled once per machine);
- "triton": the engine.kernels Triton kernels (GPU; on CPU only under TRITON_INTERPRET=1);
- "auto": Triton on CUDA; on CPU "cpu" when its kernel builds, else "torch".
Every backend has the signature of `torch_backend.paged_attention`.
"""

import logging

from engine.attention.metadata import AttentionMetadata
from engine.attention.torch_backend import paged_attention as torch_paged_attention

logger = logging.getLogger("tandem.engine")

BACKENDS = ("auto", "torch", "cpu", "triton")


def resolve_backend(name: str, device: str) -> str:
    """The backend that `name` means on `device` ("auto" resolved)."""
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; use one of {', '.join(BACKENDS)}")
    if name == "auto":
        return "triton" if device.startswith("cuda") else "cpu"
    return name


def select_backend(name: str, device: str):
    """Return the attention function for a backend name."""
    name = resolve_backend(name, device)
    if name == "triton":
        from engine.attention.triton_backend import make_triton_paged_attention

        return make_triton_paged_attention()
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


__all__ = ["AttentionMetadata", "BACKENDS", "resolve_backend", "select_backend"]
