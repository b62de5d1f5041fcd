"""Which KV heads each tensor-parallel rank holds, and how to move them between TP sizes.

With H KV heads and TP size t, rank r holds:
  H >= t: heads [r*H/t, (r+1)*H/t)           (split; t must divide H)
  H <  t: the one head r*H//t                (MQA/GQA replicated t/H times; H must divide t)

Prefill at TP=a sends to decode at TP=b: each decode rank's heads are cut into
`Piece`s, each from one prefill rank that holds them. Where heads are replicated
on the prefill side, decode ranks are spread over the replicas.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the router imports the protocol, which must not pull in torch
    import torch


@dataclass(frozen=True)
class Piece:
    """Heads [src_head_start, +num_heads) of src_rank's shard go to [dst_head_start, +num_heads) of dst_rank's."""

    src_rank: int
    dst_rank: int
    src_head_start: int
    dst_head_start: int
    num_heads: int


def check_tp_pair(num_kv_heads: int, src_tp: int, dst_tp: int) -> None:
    for tp in (src_tp, dst_tp):
        if tp < 1 or (num_kv_heads % tp and tp % num_kv_heads):
            raise ValueError(f"TP size {tp} cannot shard {num_kv_heads} KV heads (one must divide the other)")


def rank_heads(num_kv_heads: int, tp: int, rank: int) -> range:
    """Global KV head ids held by `rank` of a TP group of size `tp`."""
    if num_kv_heads >= tp:
        per_rank = num_kv_heads // tp
        return range(rank * per_rank, (rank + 1) * per_rank)
    head = rank * num_kv_heads // tp
    return range(head, head + 1)


def shard_heads(cache: torch.Tensor, num_kv_heads: int, tp: int, rank: int) -> torch.Tensor:
    """The rank's slice of a full-head cache [num_blocks, block_size, num_kv_heads, head_dim] (a view)."""
    heads = rank_heads(num_kv_heads, tp, rank)
    return cache[:, :, heads.start : heads.stop]


def plan(num_kv_heads: int, src_tp: int, dst_tp: int) -> list[Piece]:
    """All pieces that together fill every decode rank's heads exactly once."""
    check_tp_pair(num_kv_heads, src_tp, dst_tp)
    pieces = []
    for dst_rank in range(dst_tp):
        dst_heads = rank_heads(num_kv_heads, dst_tp, dst_rank)
        for offset, head in enumerate(dst_heads):
            src_rank = _source_rank(num_kv_heads, src_tp, head, dst_rank)
            src_start = head - rank_heads(num_kv_heads, src_tp, src_rank).start
            last = pieces[-1] if pieces else None
            if last and (last.src_rank, last.dst_rank) == (src_rank, dst_rank) and (
                last.src_head_start + last.num_heads == src_start
            ):
                pieces[-1] = Piece(src_rank, dst_rank, last.src_head_start, last.dst_head_start, last.num_heads + 1)
            else:
                pieces.append(Piece(src_rank, dst_rank, src_start, offset, 1))
    return pieces


def pieces_from(num_kv_heads: int, src_tp: int, src_rank: int, dst_tp: int) -> list[Piece]:
    """What one prefill rank must send (possibly nothing, when its heads are replicas others send)."""
    return [p for p in plan(num_kv_heads, src_tp, dst_tp) if p.src_rank == src_rank]


def _source_rank(num_kv_heads: int, src_tp: int, head: int, dst_rank: int) -> int:
    holders = [r for r in range(src_tp) if head in rank_heads(num_kv_heads, src_tp, r)]
    return holders[dst_rank % len(holders)]
