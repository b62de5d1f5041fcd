"""The decoder layer's elementwise ops and its linear layer, PyTorch or native.

`layer_ops(device, dtype, linear_shapes, op_shapes)` picks the implementation once
at model load: the native CPU kernels (engine/native) when they are built and the
dtype is float32 or bfloat16, else plain PyTorch, which is also the reference the
native ops are tested against. Both follow the arithmetic of the Hugging Face
modules. Which linear kernel runs each row count is chosen by timing them on this
machine (engine.layers.linear_choice), and so is each elementwise op, native or
PyTorch (engine.layers.elementwise_choice).

A linear weight goes through `prepare_weight` once after loading, and
`linear(x, prepared, bias)` takes what it returned: the weight itself, a
`PackedWeight` for the native float32 packed kernel (see
engine/native/csrc/packed_linear.cpp), oneDNN's prepacked (blocked) copy, or
every form some band's kernel reads (`LinearForms`).
"""

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import torch
import torch.nn.functional as F

from engine.cpu_features import cpu_features
from engine.layers import cold_weights, elementwise_choice
from engine.layers.elementwise_choice import OpShapes
from engine.layers.linear_choice import Candidate, band_of, cached_choice, choose, describe
from engine.layers.quantized_choice import BlockForms, chosen_quantized_linear
from engine.native import load_cpu_kernels
from engine.quantized_weight import QuantizedWeight, dequantize

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


def dense_weight(weight, kernels=None) -> Tensor:
    """The [out, in] matrix of a prepared weight (for checks; packing is exact, so this is the checkpoint;
    GGUF blocks widen to the converted checkpoint's float32 values)."""
    if isinstance(weight, BlockForms):
        weight = weight.blocks
    if isinstance(weight, QuantizedWeight):
        return dequantize(weight)
    if isinstance(weight, LinearForms):
        return weight.forms["dense"] if "dense" in weight.forms else dense_weight(next(iter(weight.forms.values())))
    if isinstance(weight, PackedWeight):
        return (kernels or load_cpu_kernels()).unpack_linear_weight(weight.data, weight.out_features)
    return weight.to_dense() if weight.is_mkldnn else weight


@dataclass(frozen=True)
class LinearForms:
    """A weight kept in every form the row-count bands' kernels read (form name -> that form)."""

    forms: dict[str, object]


def onednn_weight(weight: Tensor) -> Tensor:
    """oneDNN's blocked copy of a [out, in] weight, laid out once for its matmul (an mkldnn tensor)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach())


def onednn_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x @ weight.T + bias on oneDNN's prepacked weight: no per-call reorder of the weight (bfloat16: the
    same bits as F.linear, which reorders it on every call)."""
    return torch.ops.mkldnn._linear_pointwise(x if x.stride(-1) == 1 else x.contiguous(), weight, bias, "none", [], "")


def onednn_works(dtype: torch.dtype) -> bool:
    """Whether this torch build runs oneDNN's prepacked linear in `dtype` on this CPU."""
    try:
        weight = torch.ones(8, 16, dtype=dtype)
        out = onednn_linear(torch.ones(2, 16, dtype=dtype), onednn_weight(weight))
        return bool((out == 16).all())
    except (RuntimeError, AttributeError):
        return False


def _mv(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    out = torch.mv(weight, x[0])[None]  # one row: a matrix-vector product
    return out if bias is None else out + bias


def linear_candidates(kernels, dtype: torch.dtype) -> list[Candidate]:
    """The kernels that may run a linear of `dtype` on the CPU (see engine.layers.linear_choice)."""

    def few(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        return kernels.small_linear(x if x.stride(-1) == 1 else x.contiguous(), weight, bias)

    candidates = [Candidate("dense", "dense", F.linear), Candidate("mv", "dense", _mv, max_rows=1),
                  Candidate("few", "dense", few, max_rows=16)]  # fmt: skip
    if dtype == torch.float32:
        _, packed = make_packed_linear(kernels)
        candidates.append(Candidate("packed", "packed", packed))
    if onednn_works(dtype):
        candidates.append(Candidate("onednn", "onednn", onednn_linear))
    return candidates


def dense_makers(kernels) -> dict[str, Callable[[Tensor], object]]:
    """Form name -> what makes it from a dense [out, in] weight (the forms `linear_candidates` read)."""
    pack, _ = make_packed_linear(kernels)
    return {"dense": lambda w: w, "packed": pack, "onednn": onednn_weight}


def chosen_linear(kernels, dtype: torch.dtype, shapes: Sequence[tuple[int, int]],
                  choice: Sequence[str] | None = None) -> tuple[Callable, Callable, str]:  # fmt: skip
    """(linear, prepare_weight, description): per band of row counts, the kernel timed fastest on these
    shapes (or `choice`, a candidate name per band, as given: tests)."""
    candidates = {c.name: c for c in linear_candidates(kernels, dtype)}
    makers = dense_makers(kernels)
    key = [*machine_key(kernels, dtype), " ".join(sorted(candidates)), repr(sorted(set(shapes))), cold_weights.KEY]
    if choice is None:
        choice = cached_choice(key, lambda: choose(list(candidates.values()), sorted(set(shapes)), dtype, makers))
    by_band = [candidates[name] for name in choice]
    forms = sorted({c.form for c in by_band})

    def prepare(weight: Tensor):
        if len(forms) == 1:
            return makers[forms[0]](weight)
        return LinearForms({form: makers[form](weight) for form in forms})

    def linear(x: Tensor, weight, bias: Tensor | None = None) -> Tensor:
        kernel = by_band[band_of(x.shape[0])]
        return kernel.run(x, weight.forms[kernel.form] if isinstance(weight, LinearForms) else weight, bias)

    return linear, prepare, describe(choice)


@dataclass(frozen=True)
class LayerOps:
    rms_norm: Callable[[Tensor, Tensor, float], Tensor]
    add_rms_norm: Callable[[Tensor, Tensor, Tensor, float], tuple[Tensor, Tensor]]
    rotary: Callable[[Tensor, int, Tensor, Tensor], Tensor]
    silu_and_mul: Callable[[Tensor], Tensor]
    linear: Callable[..., Tensor]  # (x, weight as prepare_weight returned it, bias=None)
    name: str
    prepare_weight: Callable[[Tensor], object] = lambda weight: weight
    # (the GGUF blocks of a weight, the weight as loaded) -> what `linear` takes (quantized_choice.BlockForms);
    # None: these ops take no blocks (engine.gguf_weights attaches them only where native ops will run)
    prepare_quantized: Callable[[QuantizedWeight, Tensor], object] | None = None


TORCH_OPS = LayerOps(torch_rms_norm, torch_add_rms_norm, torch_rotary, torch_silu_and_mul, F.linear, "torch")


def machine_key(kernels, dtype: torch.dtype) -> list[str]:
    """What a timed choice depends on besides the shapes: the CPU, threads, dtype, torch and our kernels."""
    return [cpu_features().signature(), f"threads {torch.get_num_threads()}", str(dtype), f"torch {torch.__version__}",
            kernels.__name__]  # fmt: skip


TORCH_ELEMENTWISE = {"rms_norm": torch_rms_norm, "add_rms_norm": torch_add_rms_norm, "rotary": torch_rotary,
                     "silu_and_mul": torch_silu_and_mul}  # fmt: skip


def native_elementwise(kernels) -> dict[str, Callable]:
    def add_rms_norm(x, residual, weight, eps):
        return kernels.add_rms_norm(x, residual, weight, eps), residual  # residual updated in place

    def rotary(x, num_heads, cos, signed_sin):
        return kernels.rotary_(x, num_heads, cos, signed_sin)[:, :num_heads]

    return {"rms_norm": kernels.rms_norm, "add_rms_norm": add_rms_norm, "rotary": rotary,
            "silu_and_mul": kernels.silu_and_mul}  # fmt: skip


def chosen_elementwise(kernels, dtype: torch.dtype, shapes: OpShapes | None,
                       choice: Sequence[str] | None = None) -> tuple[dict[str, Callable], str]:  # fmt: skip
    """(op -> function, description): per band of row counts, native or torch, whichever was timed faster
    on `shapes` (or `choice` as given; no shapes and no choice: native throughout)."""
    impls = {"native": native_elementwise(kernels), "torch": TORCH_ELEMENTWISE}
    if choice is None and shapes is None:
        return impls["native"], "native"
    if choice is None:
        key = [*machine_key(kernels, dtype), "elementwise", repr(shapes)]
        choice = cached_choice(key, lambda: elementwise_choice.choose_elementwise(impls, shapes, dtype),
                               "elementwise ops", elementwise_choice.describe)  # fmt: skip
    return elementwise_choice.dispatched(impls, choice), elementwise_choice.describe(choice)


def native_ops(kernels, dtype: torch.dtype, linear_shapes: Sequence[tuple[int, int]],
               linear_choice: Sequence[str] | None = None, op_shapes: OpShapes | None = None,
               elementwise: Sequence[str] | None = None, quantized_shapes: Mapping[str, Sequence] | None = None,
               quantized_choice: Mapping[str, Sequence[str]] | None = None,
               int8_activations: bool = False) -> LayerOps:  # fmt: skip
    """The native kernels where they are faster here: for each band of row counts the linear kernel timed
    fastest on `linear_shapes` (the model's [out, in] weights), or the one `linear_choice` names, and each
    elementwise op native or torch as timed on `op_shapes` (or as `elementwise` names). Weights in GGUF
    blocks (`quantized_shapes`: their [out, in] shapes by type) get their kernels chosen the same way
    (`engine.layers.quantized_choice`), and `linear` sends each weight to its own."""
    ops, ops_chosen = chosen_elementwise(kernels, dtype, op_shapes, elementwise)
    linear, prepare, chosen = chosen_linear(kernels, dtype, linear_shapes, linear_choice)
    name = f"native; linears by rows: {chosen}; elementwise by rows: {ops_chosen}"
    prepare_quantized = None
    if quantized_shapes:
        quantized, prepare_quantized, quantized_chosen = chosen_quantized_linear(
            kernels, dtype, quantized_shapes, machine_key(kernels, dtype), linear_candidates(kernels, dtype),
            dense_makers(kernels), quantized_choice, int8_activations)  # fmt: skip
        linear, name = _by_weight_kind(linear, quantized), f"{name}; GGUF blocks by rows: {quantized_chosen}"
    return LayerOps(ops["rms_norm"], ops["add_rms_norm"], ops["rotary"], ops["silu_and_mul"], linear, name,
                    prepare, prepare_quantized)  # fmt: skip


def _by_weight_kind(dense: Callable[..., Tensor], quantized: Callable[..., Tensor]) -> Callable[..., Tensor]:
    def linear(x: Tensor, weight, bias: Tensor | None = None) -> Tensor:
        return (quantized if isinstance(weight, BlockForms) else dense)(x, weight, bias)

    return linear


def native_kernels_for(device: str, dtype: torch.dtype):
    """The native CPU kernels where they run a model on `device` in `dtype` (float32 or bfloat16 on the CPU,
    once built); None elsewhere, where the PyTorch ops run it."""
    return load_cpu_kernels() if device == "cpu" and dtype in (torch.float32, torch.bfloat16) else None


def layer_ops(device: str, dtype: torch.dtype, linear_shapes: Sequence[tuple[int, int]] = (),
              op_shapes: OpShapes | None = None,
              quantized_shapes: Mapping[str, Sequence[tuple[int, int]]] | None = None,
              int8_activations: bool = False) -> LayerOps:  # fmt: skip
    """The layer's ops for a model on `device` (see the module doc). A model with weights in GGUF blocks
    (`quantized_shapes`) needs the native kernels: the loader attaches blocks only where they load.
    `int8_activations`: the blocks' candidates include integer products over activations quantized to int8."""
    kernels = native_kernels_for(device, dtype) if linear_shapes or quantized_shapes else None
    if kernels is None:
        return TORCH_OPS
    return native_ops(kernels, dtype, linear_shapes, op_shapes=op_shapes, quantized_shapes=quantized_shapes,
                      int8_activations=int8_activations)  # fmt: skip
