"""Attention over the paged KV cache, behind one call that the model code uses.

`attention_backend` picks the implementation:
- "torch": plain PyTorch (SDPA over gathered K/V), the reference for every kernel;
- "cpu": native C++ kernels that read the paged cache in place (compiled once per
  machine): decode always, prefill per band of chunk lengths where timing here
  found it faster than SDPA (engine.attention.prefill_choice);
- "triton": the engine.kernels Triton kernels (GPU; on CPU only under TRITON_INTERPRET=1);
- "auto": Triton on CUDA; on CPU "cpu" when its kernel builds, else "torch".
Every backend has the signature of `torch_backend.paged_attention`.
"""

import functools
import logging

import torch

from engine.attention.metadata import AttentionMetadata
from engine.attention.prefill_choice import AttentionShapes, choose_prefill
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


def select_backend(name: str, device: str, shapes: AttentionShapes | None = None, dtype: torch.dtype | None = None):
    """Return the attention function for a backend name; "cpu" chooses its prefill implementation by timing
    both on `shapes` in `dtype` (without them: native throughout)."""
    name = resolve_backend(name, device)
    if name == "triton":
        from engine.attention.triton_backend import make_triton_paged_attention

        return make_triton_paged_attention()
    if name == "cpu":
        return _cpu_backend(device, shapes, dtype)
    return torch_paged_attention


def _cpu_backend(device: str, shapes: AttentionShapes | None, dtype: torch.dtype | None):
    from engine.attention.cpu_backend import make_cpu_paged_attention, prefill_impls
    from engine.layers.linear_choice import cached_choice, describe
    from engine.layers.ops import machine_key
    from engine.native import load_cpu_kernels

    kernels = load_cpu_kernels() if device == "cpu" else None
    if kernels is None:
        logger.info("attention backend: torch (native CPU kernels not available)")
        return torch_paged_attention
    if shapes is None or dtype is None:
        return make_cpu_paged_attention(kernels)
    impls = prefill_impls(kernels)
    key = [*machine_key(kernels, dtype), "prefill attention", repr(shapes)]
    by_tokens = functools.partial(describe, unit="token")
    choice = cached_choice(key, lambda: choose_prefill(impls, shapes, dtype), "prefill attention", by_tokens)
    logger.info("attention backend: cpu (decode: native; prefill by chunk length: %s)", by_tokens(choice))
    return make_cpu_paged_attention(kernels, choice)


__all__ = ["AttentionMetadata", "AttentionShapes", "BACKENDS", "resolve_backend", "select_backend"]
