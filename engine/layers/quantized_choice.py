"""Which kernel multiplies a weight kept in GGUF blocks (`engine.quantized_weight`), per band of row counts,
chosen by timing both on the model's own shapes of each quantized type (as `linear_choice` does for dense
weights), cached and logged:

    blocks   native: each block widened in registers and multiplied into up to 8 rows while it is there
             (a decode step reads only the blocks: the file's bytes)
    widen    native: the whole weight widened to float32 once, then F.linear (a prefill's many rows)

The products run in float32: bfloat16 activations are widened for them and the result rounded back.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import torch
import torch.nn.functional as F

from engine.layers.linear_choice import Candidate, band_of, cached_choice, choose, describe
from engine.quantized_weight import QuantizedWeight, quantize

Tensor = torch.Tensor


def quantized_candidates(kernels) -> list[Candidate]:
    def blocks(x: Tensor, w: QuantizedWeight, bias: Tensor | None = None) -> Tensor:
        return kernels.quantized_linear(x, w.qtype, w.codes, w.scales, w.offsets, bias)

    def widen(x: Tensor, w: QuantizedWeight, bias: Tensor | None = None) -> Tensor:
        return F.linear(x, kernels.dequantize_blocks(w.qtype, w.codes, w.scales, w.offsets), bias)

    return [Candidate("blocks", "quantized", blocks), Candidate("widen", "quantized", widen)]


def chosen_quantized_linear(kernels, shapes: Mapping[str, Sequence[tuple[int, int]]], machine: Sequence[str],
                            choice: Mapping[str, Sequence[str]] | None = None) -> tuple[Callable, str]:  # fmt: skip
    """(linear, description): for each quantized type, per band of row counts, the candidate timed fastest on
    that type's [out, in] `shapes` (or `choice[qtype]` as given: tests). `machine`: the timing's cache key
    parts (ops.machine_key)."""
    candidates = {c.name: c for c in quantized_candidates(kernels)}
    by_type, described = {}, []
    for qtype, type_shapes in sorted(shapes.items()):
        names = (choice or {}).get(qtype)
        if names is None:
            key = [*machine, f"quantized {qtype}", " ".join(sorted(candidates)), repr(sorted(set(type_shapes)))]
            prepare = {"quantized": lambda w, qtype=qtype: quantize(w, qtype)}
            names = cached_choice(key, lambda: choose(list(candidates.values()), sorted(set(type_shapes)),
                                                      torch.float32, prepare), f"{qtype} linear kernels")  # fmt: skip
        by_type[qtype] = [candidates[name] for name in names]
        described.append(f"{qtype}: {describe(names)}")

    def linear(x: Tensor, weight: QuantizedWeight, bias: Tensor | None = None) -> Tensor:
        kernel = by_type[weight.qtype][band_of(x.shape[0])]
        if x.dtype == torch.float32:
            return kernel.run(x if x.stride(-1) == 1 else x.contiguous(), weight, bias)
        widened_bias = None if bias is None else bias.float()
        return kernel.run(x.float().contiguous(), weight, widened_bias).to(x.dtype)

    return linear, "; ".join(described)
