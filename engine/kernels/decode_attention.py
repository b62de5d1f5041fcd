"""Paged decode attention: one query token per sequence, K/V read through the block table.

One program handles one (sequence, KV head, split): the query heads that
share the KV head are the rows of one tile, so each K/V tile is loaded once
per group (GQA/MQA). Keys are addressed token by token through the block
table, so a tile may span several cache blocks.

Long contexts split along the sequence (flash-decoding): each split writes its
partial output and log-sum-exp, and a second kernel merges the splits.

    split 0: keys [0, n)   ─┐
    split 1: keys [n, 2n)  ─┼─► reduce: out = Σ w_s · out_s,  w_s ∝ exp(lse_s)
    split 2: keys [2n, ..) ─┘
"""

import functools

import torch
import triton
import triton.language as tl

from engine.kernels import check_layout, dot_precision, keys_per_tile
from engine.kernels.paged_tile import attend_kv_tile
from engine.kernels.prefill_attention import paged_prefill_attention_ref

_LOG2E = 1.4426950408889634
_MIN_TOKENS_PER_SPLIT = 256


@triton.jit
def _decode_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    out_ptr,  # [num_seqs, num_heads, head_dim], or the split partials [num_seqs, num_heads, splits, head_dim]
    lse_ptr,  # [num_seqs, num_heads, splits] float32 (split mode only)
    qk_scale,  # softmax scale * log2(e): the kernel works in base 2
    q_token_stride,
    q_head_stride,
    table_stride,
    tokens_per_split,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    SPLIT: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    start = split * tokens_per_split
    end = tl.minimum(start + tokens_per_split, seq_len)

    rows = tl.arange(0, GROUP_PAD)  # query heads of this KV head
    heads = kv_head * GROUP + rows
    dims = tl.arange(0, HEAD_DIM)
    row_mask = rows < GROUP
    q_ptrs = q_ptr + seq * q_token_stride + heads[:, None] * q_head_stride + dims[None, :]
    q = tl.load(q_ptrs, mask=row_mask[:, None], other=0.0)  # [GROUP_PAD, HEAD_DIM]

    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)  # running max (base-2 logits)
    l = tl.zeros([GROUP_PAD], tl.float32)  # running sum of exp2(logit - m)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    q_pos = tl.zeros([GROUP_PAD], tl.int32) + seq_len - 1  # the query is the context's last token
    table_ptr = block_tables_ptr + seq * table_stride
    for tile_start in range(start, end, TILE_N):
        m, l, acc = attend_kv_tile(
            q, q_pos, m, l, acc, k_cache_ptr, v_cache_ptr, table_ptr, kv_head, tile_start, end, qk_scale,
            NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, TILE_N, DOT_PRECISION,
        )  # fmt: skip

    out_mask = row_mask[:, None]
    if SPLIT:
        # An empty split (past the sequence's end) has l = 0: it writes zeros and lse = -inf.
        has_keys = l > 0
        partial = acc / tl.where(has_keys, l, 1.0)[:, None]
        row = (seq * NUM_KV_HEADS * GROUP + heads) * num_splits + split  # [GROUP_PAD]
        tl.store(out_ptr + row[:, None] * HEAD_DIM + dims[None, :], partial, mask=out_mask)
        lse = tl.where(has_keys, m + tl.log2(tl.where(has_keys, l, 1.0)), float("-inf"))
        tl.store(lse_ptr + row, lse, mask=row_mask)
    else:
        out_rows = seq * NUM_KV_HEADS * GROUP + heads
        out = acc / l[:, None]
        out_ptrs = out_ptr + out_rows[:, None] * HEAD_DIM + dims[None, :]
        tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _reduce_splits_kernel(
    partial_ptr,  # [num_seqs * num_heads, splits, head_dim] float32
    lse_ptr,  # [num_seqs * num_heads, splits] float32, base 2
    out_ptr,  # [num_seqs * num_heads, head_dim]
    num_splits,
    HEAD_DIM: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)  # one (sequence, head)
    splits = tl.arange(0, SPLITS_PAD)
    dims = tl.arange(0, HEAD_DIM)
    lse = tl.load(lse_ptr + row * num_splits + splits, mask=splits < num_splits, other=float("-inf"))
    weight = tl.exp2(lse - tl.max(lse, 0))  # [SPLITS_PAD]; 0 for empty splits
    partial_ptrs = partial_ptr + (row * num_splits + splits[:, None]) * HEAD_DIM + dims[None, :]
    partial = tl.load(partial_ptrs, mask=(splits < num_splits)[:, None], other=0.0)  # [SPLITS_PAD, HEAD_DIM]
    out = tl.sum(partial * weight[:, None], 0) / tl.sum(weight, 0)
    tl.store(out_ptr + row * HEAD_DIM + dims, out.to(out_ptr.dtype.element_ty))


def paged_decode_attention(
    query: torch.Tensor,  # [num_seqs, num_heads, head_dim], last dim contiguous
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim], contiguous
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [num_seqs, max_blocks]
    seq_lens: torch.Tensor,  # [num_seqs] int32, tokens in context including this one
    scale: float,
    max_seq_len: int | None = None,  # host upper bound on seq_lens (keys past it are never read)
    num_splits: int | None = None,  # None: enough splits to fill the device
    out: torch.Tensor | None = None,  # [num_seqs, num_heads, head_dim], contiguous
) -> torch.Tensor:
    num_seqs, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    group = num_heads // num_kv_heads
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device) if out is None else out
    check_layout((query,), (key_cache, value_cache), out)
    if num_seqs == 0:
        return out
    max_seq_len = max_seq_len or block_tables.shape[1] * block_size
    if num_splits is None:
        num_splits = choose_num_splits(num_seqs * num_kv_heads, max_seq_len, query.device)
    tile_n = keys_per_tile(head_dim)
    tokens_per_split = triton.cdiv(triton.cdiv(max_seq_len, num_splits), tile_n) * tile_n
    split = num_splits > 1
    if split:
        partial = torch.empty(num_seqs, num_heads, num_splits, head_dim, dtype=torch.float32, device=query.device)
        lse = torch.empty(num_seqs, num_heads, num_splits, dtype=torch.float32, device=query.device)
    else:
        partial, lse = out, out  # lse is unused without splits
    _decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        query,
        key_cache,
        value_cache,
        block_tables,
        seq_lens,
        partial,
        lse,
        scale * _LOG2E,
        query.stride(0),
        query.stride(1),
        block_tables.stride(0),
        tokens_per_split,
        NUM_KV_HEADS=num_kv_heads,
        GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)),  # tl.dot needs 16 rows
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        DOT_PRECISION=dot_precision(key_cache.dtype),
        TILE_N=tile_n,
        SPLIT=split,
    )
    if split:
        _reduce_splits_kernel[(num_seqs * num_heads,)](
            partial, lse, out, num_splits, HEAD_DIM=head_dim, SPLITS_PAD=triton.next_power_of_2(num_splits)
        )
    return out


def paged_decode_attention_ref(
    query, key_cache, value_cache, block_tables, seq_lens, scale, max_seq_len=None, num_splits=None, out=None
) -> torch.Tensor:
    """The PyTorch path: each decode is a prefill chunk of one token at the end of its context."""
    query_start_loc = torch.arange(query.shape[0] + 1, dtype=torch.int32, device=query.device)
    return paged_prefill_attention_ref(
        query, key_cache, value_cache, block_tables, query_start_loc, seq_lens, 1, scale, out=out
    )


def choose_num_splits(num_programs: int, max_seq_len: int, device: torch.device) -> int:
    """Splits (a power of two) so that about two programs run per SM, none shorter than 256 keys."""
    if device.type != "cuda":
        return 1
    target = 2 * _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    wanted = min(triton.cdiv(target, num_programs), triton.cdiv(max_seq_len, _MIN_TOKENS_PER_SPLIT))
    return triton.next_power_of_2(max(1, wanted))


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count
