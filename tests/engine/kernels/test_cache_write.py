"""The Triton cache write equals the PyTorch one bit for bit, -1 slots skipped."""

import pytest
import torch

from engine.kernels.cache_write import reshape_and_cache, reshape_and_cache_ref

# (block_size, num_kv_heads, head_dim)
SHAPES = [(16, 1, 64), (32, 2, 128), (16, 3, 64)]


def check_cache_write(block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, device: str = "cpu"):
    torch.manual_seed(0)
    num_blocks, num_tokens = 6, 21
    # K and V as strided views of one fused projection, as the model passes them.
    qkv = torch.randn(num_tokens, 4 + 2 * num_kv_heads, head_dim).to(device=device, dtype=dtype)
    key, value = qkv[:, 4 : 4 + num_kv_heads], qkv[:, 4 + num_kv_heads :]
    slots = torch.randperm(num_blocks * block_size)[:num_tokens]
    slots[[0, 7, 20]] = -1
    slots = slots.to(device)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    caches = [torch.full(shape, 7.0, dtype=dtype, device=device) for _ in range(4)]
    reshape_and_cache(key, value, caches[0], caches[1], slots)
    reshape_and_cache_ref(key, value, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    written = (caches[0] != 7.0).flatten(2).any(-1).sum()
    assert int(written) == num_tokens - 3


@pytest.mark.parametrize(
    "block_size,num_kv_heads,head_dim,dtype",
    [(*SHAPES[0], torch.float32), (*SHAPES[1], torch.bfloat16), (*SHAPES[2], torch.float16)],
)
def test_cache_write_is_bit_exact_and_skips_empty_slots(block_size, num_kv_heads, head_dim, dtype):
    check_cache_write(block_size, num_kv_heads, head_dim, dtype)
