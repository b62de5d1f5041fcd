"""The step both attention kernels repeat: attend to one tile of keys read through the block table.

Online softmax in base 2 (the logits come pre-scaled by log2(e)): running row
max m, running sum l of exp2(logit - m), and the unnormalised output acc are
rescaled whenever the max grows, so no attention matrix is ever held.
"""

import triton
import triton.language as tl


@triton.jit
def attend_kv_tile(
    q,  # [ROWS, HEAD_DIM] queries, all in one sequence
    q_pos,  # [ROWS] position of each query row in the sequence
    m,  # [ROWS] float32 running max
    l,  # [ROWS] float32 running sum
    acc,  # [ROWS, HEAD_DIM] float32 running output
    k_cache_ptr,
    v_cache_ptr,
    table_ptr,  # this sequence's row of the block table
    kv_head,
    tile_start,  # first key position of the tile
    kv_end,  # keys at kv_end and after are not read
    qk_scale,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pos = tile_start + tl.arange(0, TILE_N)  # [TILE_N] key positions
    valid = pos < kv_end
    block = tl.load(table_ptr + pos // BLOCK_SIZE, mask=valid, other=0)
    slot = block.to(tl.int64) * BLOCK_SIZE + pos % BLOCK_SIZE
    dims = tl.arange(0, HEAD_DIM)
    kv_offs = slot[:, None] * (NUM_KV_HEADS * HEAD_DIM) + kv_head * HEAD_DIM + dims[None, :]  # [TILE_N, HEAD_DIM]
    k = tl.load(k_cache_ptr + kv_offs, mask=valid[:, None], other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [ROWS, TILE_N]
    # Causal: a query sees keys up to its own position. Callers start at key 0 or
    # only pass rows that see some key of their first tile, so m stays finite.
    s = tl.where(valid[None, :] & (pos[None, :] <= q_pos[:, None]), s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, 1))
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m - m_new)
    v = tl.load(v_cache_ptr + kv_offs, mask=valid[:, None], other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l * alpha + tl.sum(p, 1), acc
