"""The decoder layer's elementwise ops and its linear layer, PyTorch or native.

`layer_ops(device, dtype)` picks the implementation once at model load: the
native CPU kernels (engine/native) when they are built and the dtype is float32
or bfloat16, else plain PyTorch, which is also the reference the native ops are
tested against. Both follow the arithmetic of the Hugging Face modules.

A linear weight goes through `prepare_weight` once after loading, and
`linear(x, prepared, bias)` takes what it returned: the weight itself, or for
native float32 a `PackedWeight` (see engine/native/csrc/packed_linear.cpp).
"""

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from engine.native import load_cpu_kernels

Tensor = torch.Tensor


def torch_rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    # x: [tokens, dim]; normalised in float32 and cast back, as LlamaRMSNorm does
    if x.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)  # one fused op, same bits as below
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def torch_add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """(rms_norm(residual + x), residual + x)."""
    residual = residual + x
    return torch_rms_norm(residual, weight, eps), residual


def torch_rotary(x: Tensor, num_heads: int, cos: Tensor, signed_sin: Tensor) -> Tensor:
    """Rotate the first `num_heads` heads of x: [tokens, heads, head_dim]; cos, signed_sin: [tokens, head_dim].

    rotate_half(x) = cat(-x2, x1) = roll(x, half) with the first half's sign folded into signed_sin.
    Returns the rotated heads [tokens, num_heads, head_dim].
    """
    x = x[:, :num_heads]
    cos, signed_sin = cos[:, None], signed_sin[:, None]
    return x * cos + torch.roll(x, x.shape[-1] // 2, dims=-1) * signed_sin


def torch_silu_and_mul(gate_up: Tensor) -> Tensor:
    gate, up = gate_up.chunk(2, dim=-1)  # [tokens, intermediate] each
    return F.silu(gate) * up


@dataclass(frozen=True)
class PackedWeight:
    """A float32 linear weight in the native kernel's panel layout; the dense [out, in] copy is gone."""

    data: Tensor  # [ceil(out_features / 32), in_features, 32]
    out_features: int


def make_packed_linear(kernels) -> tuple[Callable[[Tensor], PackedWeight], Callable[..., Tensor]]:
    """(prepare_weight, linear) over weights packed once at load: every row count, float32."""

    def pack(weight: Tensor) -> PackedWeight:
        return PackedWeight(kernels.pack_linear_weight(weight.detach()), weight.shape[0])

    def linear(x: Tensor, weight: PackedWeight, bias: Tensor | None = None) -> Tensor:
        return kernels.packed_linear(x if x.stride(-1) == 1 else x.contiguous(), weight.data, weight.out_features, bias)

    return pack, linear


def dense_weight(weight: Tensor | PackedWeight, kernels=None) -> Tensor:
    """The [out, in] matrix of a prepared weight (for checks; packing is exact, so this is the checkpoint)."""
    if isinstance(weight, PackedWeight):
        return (kernels or load_cpu_kernels()).unpack_linear_weight(weight.data, weight.out_features)
    return weight


# Row counts where the native kernel beat BLAS GEMM on the dev CPU (2 threads, the
# default model's layer shapes): 1.25x at 4 rows, 1.1x at 16; at 2 rows GEMM wins.
SMALL_BATCH_ROWS = range(3, 17)


def make_cpu_linear(kernels) -> Callable[..., Tensor]:
    """F.linear for CPU by row count: one row as a matrix-vector product, a few rows
    through the native kernel that streams the weight once (BLAS packs the weight
    first, which for a few rows costs more than the product), more rows as GEMM."""

    def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        rows = x.shape[0]
        if rows == 1:
            out = torch.mv(weight, x[0])[None]
            return out if bias is None else out + bias
        # Zero rows (a step of prompt chunks that sample nothing has no logits rows) go to F.linear.
        if rows in SMALL_BATCH_ROWS and x.stride(-1) == 1:
            return kernels.small_linear(x, weight, bias)
        return F.linear(x, weight, bias)

    return linear


@dataclass(frozen=True)
class LayerOps:
    rms_norm: Callable[[Tensor, Tensor, float], Tensor]
    add_rms_norm: Callable[[Tensor, Tensor, Tensor, float], tuple[Tensor, Tensor]]
    rotary: Callable[[Tensor, int, Tensor, Tensor], Tensor]
    silu_and_mul: Callable[[Tensor], Tensor]
    linear: Callable[..., Tensor]  # (x, weight as prepare_weight returned it, bias=None)
    name: str
    prepare_weight: Callable[[Tensor], object] = lambda weight: weight


TORCH_OPS = LayerOps(torch_rms_norm, torch_add_rms_norm, torch_rotary, torch_silu_and_mul, F.linear, "torch")


def native_ops(kernels, dtype: torch.dtype = torch.bfloat16) -> LayerOps:
    def add_rms_norm(x, residual, weight, eps):
        return kernels.add_rms_norm(x, residual, weight, eps), residual  # residual updated in place

    def rotary(x, num_heads, cos, signed_sin):
        return kernels.rotary_(x, num_heads, cos, signed_sin)[:, :num_heads]

    elementwise = (kernels.rms_norm, add_rms_norm, rotary, kernels.silu_and_mul)
    if dtype == torch.float32:
        pack, linear = make_packed_linear(kernels)
        return LayerOps(*elementwise, linear, "native, packed float32 linears", pack)
    return LayerOps(*elementwise, make_cpu_linear(kernels), "native")


def layer_ops(device: str, dtype: torch.dtype) -> LayerOps:
    if device != "cpu":
        return TORCH_OPS
    kernels = load_cpu_kernels() if dtype in (torch.float32, torch.bfloat16) else None
    return TORCH_OPS if kernels is None else native_ops(kernels, dtype)
