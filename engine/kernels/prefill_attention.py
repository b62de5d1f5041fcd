"""Prefill / extend attention over the paged cache for a ragged batch of query chunks.

Chunk i has queries [query_start_loc[i], query_start_loc[i+1]) and a context
of seq_lens[i] tokens, all already in the cache (the new ones were just
written). Its queries are the last tokens of the context, so query j sees
keys 0 .. prefix + j where prefix = seq_len - chunk length: earlier chunks and
prefix-cache hits in full, its own new tokens causally.

    keys:    [ cached prefix ......... | new tokens ]
    query j:  all of the prefix         ≤ its own position

One program handles a tile of TOKENS queries of one chunk for one KV head,
with all the query heads that share it (GQA) as rows, so each K/V tile is
read once per group:

    row r = (token r // GROUP_PAD, query head kv_head * GROUP + r % GROUP_PAD)

and an online softmax over TILE_N keys at a time: no attention matrix is
materialised.
"""

import torch
import triton
import triton.language as tl

from engine.attention.metadata import AttentionMetadata
from engine.attention.torch_backend import attend_prefills
from engine.kernels import check_layout, dot_precision, keys_per_tile
from engine.kernels.paged_tile import attend_kv_tile

_LOG2E = 1.4426950408889634


@triton.jit
def _prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    out_ptr,  # [num_tokens, num_heads, head_dim], contiguous
    qk_scale,  # softmax scale * log2(e): the kernel works in base 2
    q_token_stride,
    q_head_stride,
    table_stride,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TOKENS: tl.constexpr,
    TILE_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    BLOCK_M: tl.constexpr = TOKENS * GROUP_PAD
    seq = tl.program_id(0).to(tl.int64)
    q_tile = tl.program_id(1)
    kv_head = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + seq)
    prefix = seq_len - q_len

    rows = tl.arange(0, BLOCK_M)
    token = q_tile * TOKENS + rows // GROUP_PAD  # [BLOCK_M] query index within the chunk
    head = kv_head * GROUP + rows % GROUP_PAD  # [BLOCK_M] query head
    row_mask = (token < q_len) & (rows % GROUP_PAD < GROUP)
    q_pos = prefix + token  # [BLOCK_M] position of each query in its sequence
    dims = tl.arange(0, HEAD_DIM)
    row_offs = (q_start + token).to(tl.int64) * q_token_stride + head * q_head_stride  # [BLOCK_M]
    q = tl.load(q_ptr + row_offs[:, None] + dims[None, :], mask=row_mask[:, None], other=0.0)  # [BLOCK_M, HEAD_DIM]
    # Keys past this tile's last query are never seen; a tile past the chunk reads none.
    kv_end = tl.where(q_tile * TOKENS < q_len, tl.minimum(prefix + (q_tile + 1) * TOKENS, seq_len), 0)

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    table_ptr = block_tables_ptr + seq * table_stride
    for tile_start in range(0, kv_end, TILE_N):
        # Key 0 is visible to every row, so each row's max is finite after the first tile.
        m, l, acc = attend_kv_tile(
            q, q_pos, m, l, acc, k_cache_ptr, v_cache_ptr, table_ptr, kv_head, tile_start, kv_end, qk_scale,
            NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, TILE_N, DOT_PRECISION,
        )  # fmt: skip

    out = acc / tl.where(row_mask, l, 1.0)[:, None]
    out_rows = (q_start + token).to(tl.int64) * (NUM_KV_HEADS * GROUP) + head  # [BLOCK_M]
    out_ptrs = out_ptr + out_rows[:, None] * HEAD_DIM + dims[None, :]
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_mask[:, None])


def paged_prefill_attention(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim], last dim contiguous
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim], contiguous
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [num_seqs, max_blocks]
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int32: chunk i owns query rows [loc[i], loc[i+1])
    seq_lens: torch.Tensor,  # [num_seqs] int32, context length including the chunk
    max_query_len: int,  # host copy of the longest chunk: sizes the grid without a device sync
    scale: float,
    out: torch.Tensor | None = None,  # [num_tokens, num_heads, head_dim], contiguous
    block_m: int = 64,  # query rows (tokens x query heads of a group) per program
) -> torch.Tensor:
    """Attention output of the chunks' rows; rows of `query` outside every chunk are not written."""
    num_tokens, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device) if out is None else out
    check_layout((query,), (key_cache, value_cache), out)
    num_seqs = seq_lens.shape[0]
    if num_seqs == 0 or num_tokens == 0:
        return out
    group = num_heads // num_kv_heads
    group_pad = triton.next_power_of_2(group)
    tokens = _tokens_per_program(block_m, group_pad, max_query_len)
    _prefill_kernel[(num_seqs, triton.cdiv(max_query_len, tokens), num_kv_heads)](
        query,
        key_cache,
        value_cache,
        block_tables,
        query_start_loc,
        seq_lens,
        out,
        scale * _LOG2E,
        query.stride(0),
        query.stride(1),
        block_tables.stride(0),
        NUM_KV_HEADS=num_kv_heads,
        GROUP=group,
        GROUP_PAD=group_pad,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        TOKENS=tokens,
        DOT_PRECISION=dot_precision(key_cache.dtype),
        TILE_N=keys_per_tile(head_dim),
    )
    return out


def _tokens_per_program(block_m: int, group_pad: int, max_query_len: int) -> int:
    # block_m rows in all, no more tokens than the longest chunk has, and at least 16 rows for tl.dot.
    tokens = min(max(1, block_m // group_pad), triton.next_power_of_2(max_query_len))
    return max(tokens, 16 // group_pad)


def paged_prefill_attention_ref(
    query, key_cache, value_cache, block_tables, query_start_loc, seq_lens, max_query_len, scale, out=None
) -> torch.Tensor:
    """The PyTorch path (one SDPA call per chunk over its gathered context)."""
    meta = AttentionMetadata(
        slot_mapping=torch.empty(0, dtype=torch.int64, device=query.device),
        query_start_loc=query_start_loc,
        seq_lens=seq_lens,
        block_tables=block_tables,
        num_decodes=0,
        query_start_loc_host=tuple(query_start_loc.tolist()),
        seq_lens_host=tuple(seq_lens.tolist()),
        block_size=key_cache.shape[1],
    )
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device) if out is None else out
    attend_prefills(out, query, key_cache, value_cache, meta, scale)
    return out
