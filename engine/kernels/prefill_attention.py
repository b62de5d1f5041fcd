"""Prefill / extend attention over the paged cache for a ragged batch of query chunks.

Chunk i has queries [query_start_loc[i], query_start_loc[i+1]) and a context
of seq_lens[i] tokens, all already in the cache (the new ones were just
written). Its queries are the last tokens of the context, so query j sees
keys 0 .. prefix + j where prefix = seq_len - chunk length: earlier chunks and
prefix-cache hits in full, its own new tokens causally.

    keys:    [ cached prefix ......... | new tokens ]
    query j:  all of the prefix         ≤ its own position

One program handles BLOCK_M queries of one chunk for one head, with an online
softmax over TILE_N keys at a time: no attention matrix is materialised.
"""

import torch
import triton
import triton.language as tl

from engine.attention.metadata import AttentionMetadata
from engine.attention.torch_backend import attend_prefills
from engine.kernels import check_layout, dot_precision
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
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    TILE_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    q_tile = tl.program_id(1)
    head = tl.program_id(2)
    kv_head = head // (NUM_HEADS // NUM_KV_HEADS)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + seq)
    prefix = seq_len - q_len

    rows = q_tile * BLOCK_M + tl.arange(0, BLOCK_M)  # query index within the chunk
    row_mask = rows < q_len
    q_pos = prefix + rows  # [BLOCK_M] position of each query in its sequence
    dims = tl.arange(0, HEAD_DIM)
    tokens = (q_start + rows).to(tl.int64)
    q = tl.load(
        q_ptr + tokens[:, None] * q_token_stride + head * q_head_stride + dims[None, :],
        mask=row_mask[:, None],
        other=0.0,
    )  # [BLOCK_M, HEAD_DIM]
    # Keys past this tile's last query are never seen; a tile past the chunk reads none.
    kv_end = tl.where(q_tile * BLOCK_M < q_len, tl.minimum(prefix + (q_tile + 1) * BLOCK_M, seq_len), 0)

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
    out_ptrs = out_ptr + (tokens[:, None] * NUM_HEADS + head) * HEAD_DIM + dims[None, :]
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
    block_m: int = 64,
) -> torch.Tensor:
    """Attention output of the chunks' rows; rows of `query` outside every chunk are not written."""
    num_tokens, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device) if out is None else out
    check_layout((query,), (key_cache, value_cache), out)
    num_seqs = seq_lens.shape[0]
    if num_seqs == 0 or num_tokens == 0:
        return out
    block_m = min(block_m, max(16, triton.next_power_of_2(max_query_len)))
    _prefill_kernel[(num_seqs, triton.cdiv(max_query_len, block_m), num_heads)](
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
        NUM_HEADS=num_heads,
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_M=block_m,
        DOT_PRECISION=dot_precision(key_cache.dtype),
        TILE_N=64 if head_dim <= 128 else 32,
    )
    return out


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
