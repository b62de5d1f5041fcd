"""Which implementation runs each elementwise op of a decoder layer, per band of row counts, chosen by
timing them on the machine at hand (as `linear_choice` does for the linears).

    op             native (engine/native)              torch (the reference)
    rms_norm       one fused pass per row              F.rms_norm, or float32 math
    add_rms_norm   residual += x, then the norm        two ops
    rotary         in place, Q and K heads at once     mul, roll, mul, add
    silu_and_mul   one pass                            F.silu(gate) * up

Both follow the Hugging Face modules' arithmetic (tests/engine/test_layer_ops.py). Which is faster
depends on the CPU, the build and the row count: on an AVX512-BF16 EPYC the native bfloat16 ops, before
their conversions were vectorised, were fastest for one row and 2-7x slower than PyTorch's from 16 rows
up; after, they won at every row count. The choice is cached with the linears'
(`linear_choice.cached_choice`), keyed by the CPU, the threads, the dtype, the shapes and the native
source version.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import torch

from engine.layers.kernel_timing import Timer, fastest, sample_time
from engine.layers.linear_choice import BANDS, band_of

Tensor = torch.Tensor
OPS = ("rms_norm", "add_rms_norm", "rotary", "silu_and_mul")


@dataclass(frozen=True)
class OpShapes:
    """What the elementwise ops of a model work on (one tensor-parallel rank's share)."""

    hidden: int
    intermediate: int  # per rank
    heads: int  # query + key heads, rotated together (per rank)
    head_dim: int


def op_inputs(shapes: OpShapes, rows: int, dtype: torch.dtype) -> dict[str, tuple]:
    """Arguments of each op for `rows` tokens (random: only their time is measured)."""

    def rand(*size):
        return torch.randn(*size, dtype=torch.float32).to(dtype)

    x, weight = rand(rows, shapes.hidden), rand(shapes.hidden)
    heads = rand(rows, shapes.heads + 1, shapes.head_dim)  # + a value head, as in the fused qkv rows
    cos, sin = rand(rows, shapes.head_dim), rand(rows, shapes.head_dim)
    return {"rms_norm": (x, weight, 1e-5), "add_rms_norm": (x, rand(rows, shapes.hidden), weight, 1e-5),
            "rotary": (heads, shapes.heads, cos, sin), "silu_and_mul": (rand(rows, 2 * shapes.intermediate),)}  # fmt: skip


def choose_elementwise(impls: Mapping[str, Mapping[str, Callable]], shapes: OpShapes, dtype: torch.dtype,
                       timer: Timer = sample_time) -> tuple[str, ...]:  # fmt: skip
    """Per band, "op=implementation,..." for the fastest of `impls` (name -> {op: function}) on each op."""
    choice = []
    for _, _, rows in BANDS:
        args = op_inputs(shapes, rows, dtype)
        winners = {op: fastest({name: [lambda f=impls[name][op], a=args[op]: f(*a)] for name in impls}, timer)
                   for op in OPS}  # fmt: skip
        choice.append(",".join(f"{op}={name}" for op, name in winners.items()))
    return tuple(choice)


def dispatched(impls: Mapping[str, Mapping[str, Callable]], choice: Sequence[str]) -> dict[str, Callable]:
    """op -> a function that runs the implementation its band chose (the first argument's rows decide)."""
    per_band = _per_band(choice)
    ops = {}
    for op in OPS:
        by_band = [impls[band[op]][op] for band in per_band]
        ops[op] = by_band[0] if len(set(by_band)) == 1 else _by_rows(by_band)
    return ops


def _by_rows(by_band: list[Callable]) -> Callable:
    def run(x: Tensor, *args):
        return by_band[band_of(x.shape[0])](x, *args)

    return run


def describe(choice: Sequence[str]) -> str:
    """Per op, the bands' choices in order ("silu_and_mul: native torch torch ...")."""
    per_band = _per_band(choice)
    return "; ".join(f"{op}: {' '.join(band[op] for band in per_band)}" for op in OPS)


def _per_band(choice: Sequence[str]) -> list[dict[str, str]]:
    """Each band's "op=implementation,..." as {op: implementation}."""
    return [dict(item.split("=") for item in band.split(",")) for band in choice]
