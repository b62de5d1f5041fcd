"""Prefill TP=a to decode TP=b: every decode shard equals slicing the full-head reference."""

from __future__ import annotations

import itertools

import pytest
import torch

from kvtransfer.frames import Run, run_tensor, write_run
from kvtransfer.resharding import plan, rank_heads, shard_heads

TP_SIZES = (1, 2, 4)


def test_rank_heads_split_and_replicate_like_vllm():
    assert [list(rank_heads(8, 4, r)) for r in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    # Fewer KV heads than ranks: rank r holds head r * num_kv_heads // tp.
    assert [list(rank_heads(2, 4, r)) for r in range(4)] == [[0], [0], [1], [1]]
    assert [list(rank_heads(1, 4, r)) for r in range(4)] == [[0]] * 4


@pytest.mark.parametrize("num_kv_heads", [1, 2, 4, 8])
@pytest.mark.parametrize("src_tp,dst_tp", list(itertools.product(TP_SIZES, TP_SIZES)))
def test_plan_moves_shards_into_the_reference(num_kv_heads, src_tp, dst_tp):
    full = torch.randn(6, 4, num_kv_heads, 8)  # [num_blocks, block_size, num_kv_heads, head_dim]
    prefill = [shard_heads(full, num_kv_heads, src_tp, r).contiguous() for r in range(src_tp)]
    decode = [torch.full_like(shard_heads(full, num_kv_heads, dst_tp, r), float("nan")) for r in range(dst_tp)]
    run = Run(src_start=1, dst_start=2, length=3)
    for piece in plan(num_kv_heads, src_tp, dst_tp):
        # The same two steps the sender and receiver take: gather a frame, write it.
        frame = run_tensor(prefill[piece.src_rank], run, piece.src_head_start, piece.num_heads, to_host=True)
        write_run(decode[piece.dst_rank], frame.view(-1).view(torch.uint8), run.dst_start, run.length,
                  piece.dst_head_start, piece.num_heads)  # fmt: skip
    for r in range(dst_tp):
        assert torch.equal(decode[r][2:5], shard_heads(full, num_kv_heads, dst_tp, r)[1:4])


def test_plan_spreads_replicated_sources():
    sources = {p.src_rank for p in plan(1, 4, 4)}
    assert sources == {0, 1, 2, 3}


def test_unshardable_tp_sizes_are_refused():
    with pytest.raises(ValueError, match="cannot shard 6 KV heads"):
        plan(6, 4, 1)
