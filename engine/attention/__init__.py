"""Attention over the paged KV cache, behind one call that the model code uses.

`attention_backend` picks the implementation: "torch" (a vectorised PyTorch
path, the CPU default) or "triton" (GPU kernels, added beside their PyTorch
references). Every backend has the signature of `torch_backend.paged_attention`.
"""

from engine.attention.metadata import AttentionMetadata
from engine.attention.torch_backend import paged_attention as torch_paged_attention


def select_backend(name: str, device: str):
    """Return the attention function for a backend name ("auto" = Triton on CUDA, torch on CPU)."""
    if name == "auto":
        name = "triton" if device.startswith("cuda") else "torch"
    if name == "torch":
        return torch_paged_attention
    if name == "triton":
        raise ValueError("attention_backend='triton' is not available yet; use 'torch' or 'auto'")
    raise ValueError(f"unknown attention backend {name!r}")


__all__ = ["AttentionMetadata", "select_backend"]
