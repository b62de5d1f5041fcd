"""KV cache write (`reshape_and_cache`): scatter new tokens' K and V into their cache slots.

slot = block_id * block_size + offset indexes the cache viewed as
[num_blocks * block_size, num_kv_heads, head_dim]. Slots of -1 are skipped:
padding, or tokens whose KV is already cached.
"""

import torch
import triton
import triton.language as tl

from engine.attention.torch_backend import write_kv_cache
from engine.kernels import check_layout


@triton.jit
def _cache_write_kernel(
    key_ptr,
    value_ptr,
    key_cache_ptr,
    value_cache_ptr,
    slot_mapping_ptr,
    key_token_stride,
    key_head_stride,
    value_token_stride,
    value_head_stride,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEADS_PAD: tl.constexpr,
):
    # One program per new token; it copies all its KV heads.
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    heads = tl.arange(0, HEADS_PAD)[:, None]  # [HEADS_PAD, 1]
    dims = tl.arange(0, HEAD_DIM)[None, :]  # [1, HEAD_DIM]
    # The slot test is broadcast to a block first: `block & scalar bool` gives an
    # int32 mask under the interpreter.
    slots = tl.zeros([HEADS_PAD, HEAD_DIM], tl.int64) + slot  # [HEADS_PAD, HEAD_DIM]
    mask = (heads < NUM_KV_HEADS) & (slots >= 0)
    dst = slot * (NUM_KV_HEADS * HEAD_DIM) + heads * HEAD_DIM + dims
    k = tl.load(key_ptr + token * key_token_stride + heads * key_head_stride + dims, mask=mask)
    v = tl.load(value_ptr + token * value_token_stride + heads * value_head_stride + dims, mask=mask)
    tl.store(key_cache_ptr + dst, k, mask=mask)
    tl.store(value_cache_ptr + dst, v, mask=mask)


def reshape_and_cache(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim], last dim contiguous
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim], last dim contiguous
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim], contiguous
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [num_tokens] int64, -1 = skip
) -> None:
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    check_layout((key, value), (key_cache, value_cache))
    _cache_write_kernel[(num_tokens,)](
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        HEADS_PAD=triton.next_power_of_2(num_kv_heads),
    )


def reshape_and_cache_ref(key, value, key_cache, value_cache, slot_mapping) -> None:
    write_kv_cache(key, value, key_cache, value_cache, slot_mapping)

