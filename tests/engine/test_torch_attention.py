"""The PyTorch attention path: cache writes skip -1 slots; attention equals a dense reference."""

import torch
import torch.nn.functional as F

from engine.attention.metadata import AttentionMetadata
from engine.attention.torch_backend import paged_attention, write_kv_cache


def test_cache_write_skips_minus_one_slots_bit_exactly():
    kc, vc = torch.zeros(4, 4, 2, 8), torch.zeros(4, 4, 2, 8)
    k, v = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    write_kv_cache(k, v, kc, vc, torch.tensor([5, -1, 14]))
    flat_k, flat_v = kc.view(16, 2, 8), vc.view(16, 2, 8)
    assert torch.equal(flat_k[5], k[0]) and torch.equal(flat_k[14], k[2])
    assert torch.equal(flat_v[5], v[0]) and torch.equal(flat_v[14], v[2])
    assert int((flat_k.abs().sum((1, 2)) != 0).sum()) == 2


def test_prefill_with_cached_prefix_equals_dense_causal_attention():
    """A 6-token chunk after 10 cached tokens, through a shuffled block table."""
    torch.manual_seed(0)
    heads, kv_heads, dim, bs = 4, 2, 16, 4
    total, new = 16, 6
    k_all, v_all = torch.randn(total, kv_heads, dim), torch.randn(total, kv_heads, dim)
    q = torch.randn(new, heads, dim)
    table = torch.tensor([[3, 0, 5, 1]])
    kc, vc = torch.zeros(6, bs, kv_heads, dim), torch.zeros(6, bs, kv_heads, dim)
    slots = torch.stack([table[0, p // bs] * bs + p % bs for p in range(total)])
    write_kv_cache(k_all[:-new], v_all[:-new], kc, vc, slots[:-new])  # the cached prefix
    meta = AttentionMetadata(
        slot_mapping=slots[-new:],
        query_start_loc=torch.tensor([0, new], dtype=torch.int32),
        seq_lens=torch.tensor([total], dtype=torch.int32),
        block_tables=table,
        num_decodes=0,
        query_start_loc_host=(0, new),
        seq_lens_host=(total,),
        block_size=bs,
    )
    out = paged_attention(q, k_all[-new:], v_all[-new:], kc, vc, meta, dim**-0.5)
    mask = torch.arange(total)[None, :] <= torch.arange(total - new, total)[:, None]
    ref = F.scaled_dot_product_attention(
        q.transpose(0, 1),
        k_all.repeat_interleave(heads // kv_heads, 1).transpose(0, 1),
        v_all.repeat_interleave(heads // kv_heads, 1).transpose(0, 1),
        attn_mask=mask,
    ).transpose(0, 1)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
