"""Triton prefill/extend attention equals the PyTorch path on ragged chunks with cached prefixes."""

import pytest
import torch

from engine.kernels.prefill_attention import paged_prefill_attention, paged_prefill_attention_ref
from tests.engine.kernels.paged_inputs import TOLERANCE, in_float32, paged_batch

# (block_size, head_dim, num_kv_heads, group, seq_lens, query_lens). A chunk shorter than its
# sequence extends a cached prefix (an earlier chunk or a prefix hit); 21 cached of block 16
# or 32 means the chunk starts in the middle of a block of the table.
CASES = [
    (16, 64, 2, 1, [20, 28, 64], [20, 7, 32]),
    (32, 128, 1, 4, [45, 40], [24, 19]),
    (16, 64, 1, 8, [37, 16], [5, 16]),
    (16, 64, 2, 3, [30, 9], [11, 9]),  # a group that is not a power of two (Qwen2-0.5B has 7)
]


def check_prefill(block_size, head_dim, num_kv_heads, group, seq_lens, query_lens, dtype=torch.float32, device="cpu"):
    batch = paged_batch(seq_lens, query_lens, block_size, num_kv_heads, group, head_dim, dtype, device)
    args = (
        batch.query,
        batch.key_cache,
        batch.value_cache,
        batch.block_tables,
        batch.query_start_loc,
        batch.seq_lens,
        batch.max_query_len,
        head_dim**-0.5,
    )
    # Query tiles of 16 rows: chunks longer than one tile check the tile boundaries.
    out = paged_prefill_attention(*args, block_m=16)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), paged_prefill_attention_ref(*in_float32(args)), **TOLERANCE[dtype])


@pytest.mark.parametrize("block_size,head_dim,num_kv_heads,group,seq_lens,query_lens", CASES)
def test_prefill_matches_reference(block_size, head_dim, num_kv_heads, group, seq_lens, query_lens):
    check_prefill(block_size, head_dim, num_kv_heads, group, seq_lens, query_lens)
