"""Triton paged decode attention equals the PyTorch path, with and without sequence splits."""

import pytest
import torch

from engine.kernels.decode_attention import paged_decode_attention, paged_decode_attention_ref
from tests.engine.kernels.paged_inputs import TOLERANCE, in_float32, paged_batch

# (block_size, head_dim, num_kv_heads, group, seq_lens, num_splits); lengths on and off block multiples.
CASES = [
    (16, 64, 2, 1, [1, 16, 37], 1),
    (32, 128, 1, 4, [33, 64, 5], 1),
    (16, 128, 1, 8, [100, 17], 4),  # MQA, split
    (32, 64, 2, 4, [64, 200, 3], 4),  # the short sequences leave splits empty
    (16, 64, 2, 3, [18, 7], 2),  # a group that is not a power of two
    (64, 64, 1, 4, [70, 130], 2),
    (128, 64, 1, 4, [129], 1),
]


def check_decode(block_size, head_dim, num_kv_heads, group, seq_lens, num_splits, dtype=torch.float32, device="cpu"):
    batch = paged_batch(seq_lens, [1] * len(seq_lens), block_size, num_kv_heads, group, head_dim, dtype, device)
    args = (batch.query, batch.key_cache, batch.value_cache, batch.block_tables, batch.seq_lens, head_dim**-0.5)
    out = paged_decode_attention(*args, max_seq_len=max(seq_lens), num_splits=num_splits)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), paged_decode_attention_ref(*in_float32(args)), **TOLERANCE[dtype])


@pytest.mark.parametrize("block_size,head_dim,num_kv_heads,group,seq_lens,num_splits", CASES)
def test_decode_matches_reference(block_size, head_dim, num_kv_heads, group, seq_lens, num_splits):
    check_decode(block_size, head_dim, num_kv_heads, group, seq_lens, num_splits)


def test_decode_writes_into_a_given_output_slice():
    batch = paged_batch([20, 9], [1, 1], 16, 1, 4, 64)
    args = (batch.query, batch.key_cache, batch.value_cache, batch.block_tables, batch.seq_lens, 0.125)
    out = torch.zeros(3, 4, 64)
    paged_decode_attention(*args, out=out[1:])
    torch.testing.assert_close(out[1:], paged_decode_attention_ref(*args), atol=2e-5, rtol=1e-4)
    assert torch.equal(out[0], torch.zeros(4, 64))


def test_a_layout_the_kernel_cannot_index_is_refused():
    batch = paged_batch([20, 9], [1, 1], 16, 1, 4, 64)
    args = (batch.query, batch.key_cache, batch.value_cache, batch.block_tables, batch.seq_lens, 0.125)
    with pytest.raises(ValueError, match="contiguous output"):
        paged_decode_attention(*args, out=torch.zeros(4, 2, 64).transpose(0, 1))
    with pytest.raises(ValueError, match="contiguous head_dim"):
        paged_decode_attention(batch.query.transpose(1, 2).contiguous().transpose(1, 2), *args[1:])
