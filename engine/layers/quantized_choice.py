"""Which kernel multiplies a weight kept in GGUF blocks (`engine.quantized_weight`), per band of row counts,
chosen by timing on the model's own shapes of each quantized type (as `linear_choice` does for dense weights),
cached and logged. The candidates are the blocks' own kernels and every dense one:

    blocks   native: each block widened in registers and multiplied into up to 8 rows while it is there
             (a decode step reads only the blocks: the file's bytes)
    widen    native: the whole weight widened to float32 once, then F.linear
    int8-panels  native, with AVX512-VNNI and quantization "auto" or "int8" only: each block of 32
             activations quantized to int8 with a scale of its own, then integer dot products with the
             blocks' codes repacked into panels of 16 outputs, one output per vector lane, llama.cpp's
             arithmetic (engine.quantized_panels; quantized_panels.cpp; not the float product: it rounds
             the activations)
    packed, dense, onednn, mv, few   the dense kernels (`ops.linear_candidates`), on the weight as loaded

A band that a dense kernel wins keeps that dense form beside the blocks (`BlockForms`): on the Xeon of
2026-11-28 the blocks won one row by 1.9x, and lost 64 mixed requests' batches by 12% when every band had
to read them. The float kernels of the blocks take float32: bfloat16 activations are widened for them and
the result rounded back; the integer one reads and writes either as it comes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import torch
import torch.nn.functional as F

from engine.layers import cold_weights
from engine.layers.linear_choice import Candidate, band_of, cached_choice, choose, describe
from engine.quantized_panels import pack_int8_panels
from engine.quantized_weight import QuantizedWeight, quantize

Tensor = torch.Tensor


@dataclass(frozen=True, eq=False)
class BlockForms:
    """A weight in GGUF blocks as the kernels of its bands read it: `forms` maps each form some band's kernel
    reads to the weight in it ("quantized": `blocks` with float32 scales, `for_kernels`; the others made from
    the loaded tensor)."""

    blocks: QuantizedWeight
    forms: Mapping[str, object]


# The forms made from the blocks themselves (the others from the weight as loaded): form -> maker.
BLOCK_FORMS: Mapping[str, Callable[[QuantizedWeight], object]] = {
    "quantized": lambda blocks: blocks.for_kernels(), "int8_panels": pack_int8_panels}


def quantized_candidates(kernels, int8_activations: bool = False) -> list[Candidate]:
    """The blocks' own kernels; with `int8_activations`, and the kernels built with AVX512-VNNI, the integer
    one too (its results differ from the float products by the activations' rounding)."""
    def in_float32(product: Callable[[Tensor, QuantizedWeight, Tensor | None], Tensor]):
        def run(x: Tensor, w: QuantizedWeight, bias: Tensor | None = None) -> Tensor:
            if x.dtype == torch.float32:
                return product(x if x.stride(-1) == 1 else x.contiguous(), w, bias)
            return product(x.float().contiguous(), w, None if bias is None else bias.float()).to(x.dtype)

        return run

    def blocks(x: Tensor, w: QuantizedWeight, bias: Tensor | None) -> Tensor:
        return kernels.quantized_linear(x, w.qtype, w.codes, w.scales, w.offsets, bias)

    def widen(x: Tensor, w: QuantizedWeight, bias: Tensor | None) -> Tensor:
        return F.linear(x, kernels.dequantize_blocks(w.qtype, w.codes, w.scales, w.offsets), bias)

    def int8_panels(x: Tensor, w, bias: Tensor | None = None) -> Tensor:  # float32 or bfloat16 as they come
        return kernels.quantized_panels_linear(x if x.stride(-1) == 1 else x.contiguous(), w.qtype, w.codes, w.scales,
                                               w.extra, w.out_features, None if bias is None else bias.to(x.dtype))

    exact = [Candidate("blocks", "quantized", in_float32(blocks)), Candidate("widen", "quantized", in_float32(widen))]
    if not (int8_activations and kernels.int8_dot_built()):
        return exact
    return [*exact, Candidate("int8-panels", "int8_panels", int8_panels)]


def chosen_quantized_linear(kernels, dtype: torch.dtype, shapes: Mapping[str, Sequence[tuple[int, int]]],
                            machine: Sequence[str], dense: Sequence[Candidate],
                            makers: Mapping[str, Callable[[Tensor], object]],
                            choice: Mapping[str, Sequence[str]] | None = None, int8_activations: bool = False,
                            ) -> tuple[Callable, Callable, str]:  # fmt: skip
    """(linear, prepare, description): for each quantized type, per band of row counts, the candidate timed
    fastest on that type's [out, in] `shapes` among the blocks' kernels and the `dense` ones (whose forms
    `makers` make from a dense weight), or `choice[qtype]` as given (tests). `machine`: the timing's cache
    key parts (ops.machine_key). `prepare(blocks, loaded)` makes the `BlockForms` that `linear` takes."""
    candidates = {c.name: c for c in [*quantized_candidates(kernels, int8_activations), *dense]}
    by_type, described = {}, []
    for qtype, type_shapes in sorted(shapes.items()):
        names = (choice or {}).get(qtype)
        if names is None:
            key = [*machine, f"quantized {qtype}", " ".join(sorted(candidates)), repr(sorted(set(type_shapes))),
                   cold_weights.KEY]  # fmt: skip
            prepare_timed = {**makers, **{form: lambda w, make=make, qtype=qtype: make(quantize(w, qtype))
                                          for form, make in BLOCK_FORMS.items()}}  # fmt: skip
            names = cached_choice(key, lambda: choose(list(candidates.values()), sorted(set(type_shapes)), dtype,
                                                      prepare_timed), f"{qtype} linear kernels")  # fmt: skip
        by_type[qtype] = [candidates[name] for name in names]
        described.append(f"{qtype}: {describe(names)}")

    def prepare(blocks: QuantizedWeight, loaded: Tensor) -> BlockForms:
        forms = {c.form for c in by_type[blocks.qtype]}
        made = {form: BLOCK_FORMS[form](blocks) if form in BLOCK_FORMS else makers[form](loaded) for form in forms}
        return BlockForms(blocks, made)

    def linear(x: Tensor, weight: BlockForms, bias: Tensor | None = None) -> Tensor:
        kernel = by_type[weight.blocks.qtype][band_of(x.shape[0])]
        return kernel.run(x, weight.forms[kernel.form], bias)

    return linear, prepare, "; ".join(described)
