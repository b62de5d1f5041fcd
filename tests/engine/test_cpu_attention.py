"""The native CPU decode kernel agrees with the PyTorch reference path."""

import pytest
import torch

from engine.attention.cpu_backend import make_cpu_paged_attention
from engine.attention.metadata import AttentionMetadata
from engine.attention.torch_backend import paged_attention as torch_paged_attention
from tests.engine.native_kernels import native_kernels

kernels = native_kernels(module_level=True)


def _metadata(query_lens, seq_lens, block_size, num_blocks, gen):
    """Random disjoint block tables; decodes (query length 1) must come first."""
    perm = torch.randperm(num_blocks, generator=gen)
    tables, used = [], 0
    for n in seq_lens:
        need = -(-n // block_size)
        tables.append(perm[used : used + need])
        used += need
    width = max(len(t) for t in tables)
    table = torch.zeros(len(tables), width, dtype=torch.int64)
    slots = []
    for i, (t, q, n) in enumerate(zip(tables, query_lens, seq_lens)):
        table[i, : len(t)] = t
        pos = torch.arange(n - q, n)
        slots.append(t[pos // block_size] * block_size + pos % block_size)
    starts = [0]
    for q in query_lens:
        starts.append(starts[-1] + q)
    return AttentionMetadata(
        slot_mapping=torch.cat(slots),
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=table,
        num_decodes=sum(1 for q in query_lens if q == 1),
        query_start_loc_host=tuple(starts),
        seq_lens_host=tuple(seq_lens),
        block_size=block_size,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("num_kv_heads", [8, 2, 1])  # GQA ratios 1, 4, 8
def test_cpu_backend_matches_torch_reference(dtype, block_size, head_dim, num_kv_heads):
    gen = torch.Generator().manual_seed(block_size * head_dim + num_kv_heads)
    num_heads, num_blocks = 8, 64
    # Three decodes (one at a block boundary), a prefill with a cached prefix, a fresh prefill.
    query_lens = [1, 1, 1, 5, 19]
    seq_lens = [1, block_size, 3 * block_size + 7, block_size + 9, 19]
    meta = _metadata(query_lens, seq_lens, block_size, num_blocks, gen)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    caches = [torch.randn(shape, generator=gen).to(dtype) for _ in range(4)]
    kc_ref, vc_ref, kc, vc = caches[0], caches[1], caches[0].clone(), caches[1].clone()
    num_tokens = sum(query_lens)
    q = torch.randn(num_tokens, num_heads, head_dim, generator=gen).to(dtype)
    k = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype)
    scale = head_dim**-0.5
    expected = torch_paged_attention(q, k, v, kc_ref, vc_ref, meta, scale)
    got = make_cpu_paged_attention(kernels)(q, k, v, kc, vc, meta, scale)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(got.float(), expected.float(), **tol)
    assert torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref)  # the cache write is the same


def test_decode_only_step_and_bad_input():
    gen = torch.Generator().manual_seed(0)
    meta = _metadata([1, 1], [5, 40], 16, 8, gen)
    kc, vc = torch.randn(8, 16, 2, 64), torch.randn(8, 16, 2, 64)
    q, k, v = torch.randn(2, 4, 64), torch.randn(2, 2, 64), torch.randn(2, 2, 64)
    expected = torch_paged_attention(q, k, v, kc.clone(), vc.clone(), meta, 0.125)
    got = make_cpu_paged_attention(kernels)(q, k, v, kc, vc, meta, 0.125)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    with pytest.raises(RuntimeError, match="multiple of num_kv_heads"):
        kernels.paged_decode_attention(torch.randn(2, 3, 64), kc, vc, meta.block_tables, meta.seq_lens, 0.1)


@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(9, 3, 64), (6, 1, 80), (4, 4, 32)])
def test_decode_kernel_long_contexts_and_run_time_shapes(num_heads, num_kv_heads, head_dim):
    # Many blocks with sharp score peaks exercise the online softmax's rescaling;
    # head_dim 80 and 32 take the kernel's run-time (not unrolled) path.
    gen = torch.Generator().manual_seed(num_heads * head_dim)
    seq_lens = [1, 17, 300, 129]
    meta = _metadata([1] * 4, seq_lens, 16, 64, gen)
    kc, vc = (torch.randn(64, 16, num_kv_heads, head_dim, generator=gen) for _ in range(2))
    q = 4 * torch.randn(4, num_heads, head_dim, generator=gen)
    k, v = torch.randn(4, num_kv_heads, head_dim), torch.randn(4, num_kv_heads, head_dim)
    expected = torch_paged_attention(q, k, v, kc.clone(), vc.clone(), meta, head_dim**-0.5)
    got = make_cpu_paged_attention(kernels)(q, k, v, kc, vc, meta, head_dim**-0.5)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
