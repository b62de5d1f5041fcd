"""Tensor-parallel linear layers (Megatron-style); at tp_size 1 they are plain linears.

Column-parallel: each rank holds some output rows (its q/k/v heads, its slice of
the intermediate features) and needs no communication. Row-parallel: each rank
holds the input columns matching the column-parallel layer before it, so its
output is a partial sum, all-reduced in place right after `ops.linear`.

Both are called through `project(ops, x)`, a plain method rather than
`nn.Module.__call__`, so the single-process path pays no hook dispatch.
After the weights are loaded, `prepare(ops)` turns `weight` into the form
`ops.linear` takes (packed for the native float32 kernel, which drops the
dense parameter: `dense_weight()` rebuilds it for checks), or takes the GGUF
file's quantized blocks instead (`engine.gguf_weights`).
The embedding and lm_head are not here: they stay replicated on every rank.
"""

from __future__ import annotations

from itertools import accumulate
from typing import Callable

import torch
from torch import nn

from engine.layers.ops import LayerOps, dense_weight
from engine.parallel.shard import Slice
from engine.quantized_weight import QuantizedWeight


class PreparedLinear(nn.Module):
    """Holds `weight` as loaded until `prepare(ops)`, then as `ops.prepare_weight` made it, or as the GGUF
    file's blocks when the loader found them there (`quantized`, set by `engine.gguf_weights`)."""

    kernel_weight: object = None
    quantized: QuantizedWeight | None = None

    def prepare(self, ops: LayerOps) -> None:
        if self.quantized is not None:  # the forms its bands read: the blocks, and any dense one a band chose
            self.kernel_weight, self.weight = ops.prepare_quantized(self.quantized, self.weight.data), None
            return
        weight = self.weight.data  # each `.data` is a new tensor object: compare against this one
        self.kernel_weight = ops.prepare_weight(weight)
        if self.kernel_weight is not weight:
            self.weight = None  # the prepared copy replaces it: no second copy of the weights in memory

    def dense_weight(self) -> torch.Tensor:
        return self.weight.data if self.weight is not None else dense_weight(self.kernel_weight)


class ColumnParallelLinear(PreparedLinear):
    """A fused linear (q|k|v or gate|up) holding, per fused part, this rank's slice of rows.

    `part_sizes[i]` is the full row count of checkpoint part i; this rank's rows
    `parts[i]` of it sit at rows [offsets[i], offsets[i] + parts[i].size) of `weight`.
    """

    def __init__(self, in_features: int, part_sizes: tuple[int, ...], parts: tuple[Slice, ...], bias: bool):
        super().__init__()
        self.in_features, self.part_sizes, self.parts = in_features, part_sizes, parts
        self.offsets = tuple(accumulate((p.size for p in parts), initial=0))[:-1]
        out_features = sum(p.size for p in parts)
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def project(self, ops: LayerOps, x: torch.Tensor) -> torch.Tensor:
        return ops.linear(x, self.kernel_weight, self.bias)  # [num_tokens, out_features of this rank]


class RowParallelLinear(PreparedLinear):
    """A linear without bias holding input columns `in_slice` of the full `in_features`.

    `all_reduce` sums the partial outputs over the ranks in place; None at tp_size 1.
    """

    def __init__(self, in_features: int, in_slice: Slice, out_features: int, all_reduce: Callable | None):
        super().__init__()
        self.in_features, self.in_slice = in_features, in_slice
        self.weight = nn.Parameter(torch.empty(out_features, in_slice.size))
        self.all_reduce = all_reduce

    def project(self, ops: LayerOps, x: torch.Tensor) -> torch.Tensor:
        out = ops.linear(x, self.kernel_weight)  # [num_tokens, out_features], this rank's partial sum
        if self.all_reduce is not None:
            self.all_reduce(out)
        return out
