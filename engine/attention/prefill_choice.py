"""Which implementation computes prefill attention on the CPU, per band of chunk lengths, chosen by timing
both on the machine at hand (as `engine.layers.linear_choice` does for the linears):

    native   engine/native paged_prefill.cpp: every chunk in one call, K/V read in place through the
             block table, tiles of 16 keys against 16 query rows of every head of a KV group
    sdpa     torch's scaled_dot_product_attention, one call per chunk, over K/V gathered from the cache
             (and a mask tensor when the chunk has a cached prefix)

On an AVX512-BF16 EPYC (2 threads, bfloat16, SmolLM2-135M's 9 heads over 3 KV heads of 64) the native
kernel took 2.1 ms for 16 chunks of 128 tokens where SDPA took 5.4 ms, 24 vs 36 ms for one of 2048, and
2.3 vs 4.4 ms for 6 chunks of 32 after cached prefixes of 1024. The timing covers both kinds of chunk: a
whole prompt, and the same number of tokens after a cached prefix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import torch

from engine.attention.metadata import AttentionMetadata
from engine.layers.kernel_timing import Timer, fastest, sample_time
from engine.layers.linear_choice import BANDS

# Prefix (cached tokens) of the second timed chunk of each band.
TIMED_PREFIX = 512


@dataclass(frozen=True)
class AttentionShapes:
    """What attention works on (one tensor-parallel rank's share)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int


# (out, query, key_cache, value_cache, meta, scale, seqs): fill out's rows of the prefill sequences `seqs`.
PrefillFn = Callable[..., None]


@dataclass(frozen=True)
class TimedChunk:
    """One prefill chunk of `rows` tokens after `prefix` cached ones, in a cache of its own."""

    query: torch.Tensor  # [rows, heads, dim]
    key_cache: torch.Tensor  # [blocks, block_size, kv_heads, dim]
    value_cache: torch.Tensor
    meta: AttentionMetadata


def timed_chunk(shapes: AttentionShapes, rows: int, prefix: int, dtype: torch.dtype) -> TimedChunk:
    """Random inputs (only their time is measured), laid out as the scheduler lays out a prefill chunk."""
    bs, ctx = shapes.block_size, prefix + rows
    num_blocks = -(-ctx // bs)

    def rand(*size):
        return torch.randn(*size, dtype=torch.float32).to(dtype)

    cache_shape = (num_blocks, bs, shapes.num_kv_heads, shapes.head_dim)
    meta = AttentionMetadata(
        slot_mapping=torch.arange(prefix, ctx), query_start_loc=torch.tensor([0, rows], dtype=torch.int32),
        seq_lens=torch.tensor([ctx], dtype=torch.int32), block_tables=torch.arange(num_blocks)[None],
        num_decodes=0, query_start_loc_host=(0, rows), seq_lens_host=(ctx,), block_size=bs,
    )  # fmt: skip
    return TimedChunk(rand(rows, shapes.num_heads, shapes.head_dim), rand(*cache_shape), rand(*cache_shape), meta)


def choose_prefill(impls: Mapping[str, PrefillFn], shapes: AttentionShapes, dtype: torch.dtype,
                   timer: Timer = sample_time) -> tuple[str, ...]:  # fmt: skip
    """Per band of chunk lengths, the name of the fastest of `impls` on a whole prompt plus a chunk after
    a cached prefix."""
    choice = []
    for _, _, rows in BANDS:
        chunks = [timed_chunk(shapes, rows, prefix, dtype) for prefix in (0, TIMED_PREFIX)]
        runs = {name: [lambda fn=fn, c=c: _run(fn, c) for c in chunks] for name, fn in impls.items()}
        choice.append(fastest(runs, timer))
    return tuple(choice)


def _run(fn: PrefillFn, chunk: TimedChunk) -> None:
    out = torch.empty_like(chunk.query)
    fn(out, chunk.query, chunk.key_cache, chunk.value_cache, chunk.meta, chunk.query.shape[-1] ** -0.5, [0])
