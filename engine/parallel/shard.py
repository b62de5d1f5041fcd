"""Which slice of each weight a tensor-parallel rank holds (Megatron-style), as plain arithmetic.

Column-parallel layers (fused QKV, fused gate/up) split their output rows,
row-parallel layers (o_proj, down_proj) their input columns, whose partial
outputs are then summed across ranks.

Heads: rank r holds q heads [r*H/tp, (r+1)*H/tp). KV heads split the same way
when num_kv_heads >= tp; with fewer KV heads than ranks, rank r holds the one
KV head r * num_kv_heads // tp, so each KV head is replicated on tp /
num_kv_heads consecutive ranks: exactly the KV heads its q heads attend to.
The KV transfer's re-sharding relies on this convention: keep it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Slice:
    """Rows (or columns) [start, start + size) of a full checkpoint tensor."""

    start: int
    size: int

    @property
    def stop(self) -> int:
        return self.start + self.size

    def scaled(self, factor: int) -> "Slice":
        """Heads -> rows: head h covers rows [h*head_dim, (h+1)*head_dim)."""
        return Slice(self.start * factor, self.size * factor)


def even_slice(total: int, tp_size: int, rank: int) -> Slice:
    size = total // tp_size
    return Slice(rank * size, size)


def kv_head_slice(num_kv_heads: int, tp_size: int, rank: int) -> Slice:
    """The KV heads rank `rank` holds: a 1/tp share, or one replicated head."""
    if num_kv_heads >= tp_size:
        return even_slice(num_kv_heads, tp_size, rank)
    return Slice(rank * num_kv_heads // tp_size, 1)


def num_kv_heads_per_rank(num_kv_heads: int, tp_size: int) -> int:
    return kv_head_slice(num_kv_heads, tp_size, 0).size


def qkv_slices(num_heads: int, num_kv_heads: int, head_dim: int, tp_size: int, rank: int) -> tuple[Slice, ...]:
    """Rows of the q, k and v checkpoint matrices (and biases) that this rank holds."""
    q = even_slice(num_heads, tp_size, rank).scaled(head_dim)
    kv = kv_head_slice(num_kv_heads, tp_size, rank).scaled(head_dim)
    return (q, kv, kv)


def gate_up_slices(intermediate_size: int, tp_size: int, rank: int) -> tuple[Slice, ...]:
    """Rows of the gate and the up checkpoint matrices that this rank holds."""
    part = even_slice(intermediate_size, tp_size, rank)
    return (part, part)
