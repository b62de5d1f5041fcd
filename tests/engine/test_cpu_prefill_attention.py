"""The native prefill attention kernel agrees with the PyTorch reference, and each prefill chunk runs the
implementation timed fastest for its band of chunk lengths (engine.attention.prefill_choice)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine.attention.cpu_backend import PrefillSplit, make_cpu_paged_attention, prefill_impls
from engine.attention.prefill_choice import AttentionShapes, choose_prefill, timed_chunk
from engine.attention.torch_backend import paged_attention as torch_paged_attention
from engine.layers.linear_choice import BANDS
from tests.engine.native_kernels import native_kernels_or_none
from tests.engine.test_cpu_attention import _metadata

kernels = native_kernels_or_none()  # None only where they cannot be built (tests/engine/native_kernels.py)
needs_kernels = pytest.mark.skipif(kernels is None, reason="the native CPU kernels cannot be built here")


def _step(query_lens, seq_lens, num_heads, num_kv_heads, head_dim, dtype, seed, num_blocks=96, num_decodes=None):
    gen = torch.Generator().manual_seed(seed)
    meta = _metadata(query_lens, seq_lens, 16, num_blocks, gen)
    if num_decodes is not None:  # a one-row prefill chunk is not a decode
        meta = dataclasses.replace(meta, num_decodes=num_decodes)
    kc, vc = (torch.randn(num_blocks, 16, num_kv_heads, head_dim, generator=gen).to(dtype) for _ in range(2))
    tokens = sum(query_lens)
    q = (4 * torch.randn(tokens, num_heads, head_dim, generator=gen)).to(dtype)  # sharp peaks: softmax rescaling
    k, v = (torch.randn(tokens, num_kv_heads, head_dim, generator=gen).to(dtype) for _ in range(2))
    return q, k, v, kc, vc, meta


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(9, 3, 64), (6, 1, 80), (4, 4, 128), (8, 2, 32)])
def test_native_prefill_matches_reference_over_tiles_and_cached_prefixes(dtype, num_heads, num_kv_heads, head_dim):
    # Chunks of several 16-row tiles and ragged last tiles (35, 50), after cached prefixes that end
    # mid-block (a prefix hit: 40 + 35; a later chunk of a long prompt: 300 + 50), a whole prompt of
    # 70, and one-row chunks after a prefix (the tail of a prefix-cache hit). Head dims 80 and 32
    # take the kernel's run-time (not unrolled) path.
    query_lens = [1, 1, 35, 70, 50, 1]
    seq_lens = [9, 33, 75, 70, 350, 17]
    step = _step(query_lens, seq_lens, num_heads, num_kv_heads, head_dim, dtype, seed=num_heads * head_dim,
                 num_decodes=2)
    q, k, v, kc, vc, meta = step
    expected = torch_paged_attention(q, k, v, kc.clone(), vc.clone(), meta, head_dim**-0.5)
    got = make_cpu_paged_attention(kernels)(q, k, v, kc, vc, meta, head_dim**-0.5)
    tol = dict(atol=2e-5, rtol=2e-5) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(got.float(), expected.float(), **tol)


@needs_kernels
def test_each_band_runs_its_chosen_implementation_and_together_they_fill_every_row():
    query_lens, seq_lens = [1, 3, 40, 300], [20, 3, 90, 300]  # a decode, then chunks of bands 1, 3 and 5
    by_band = ("native", "sdpa", "native", "sdpa", "sdpa", "native")
    split = PrefillSplit(by_band)
    q, k, v, kc, vc, meta = _step(query_lens, seq_lens, 8, 2, 64, torch.float32, seed=3)
    chunks = split.of(meta)
    assert chunks["sdpa"] == [1, 2] and chunks["native"].tolist() == [3]
    assert split.of(meta) is chunks  # worked out once per step, shared by the layers
    expected = torch_paged_attention(q, k, v, kc.clone(), vc.clone(), meta, 0.125)
    got = make_cpu_paged_attention(kernels, by_band)(q, k, v, kc, vc, meta, 0.125)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=2e-5)


def test_the_faster_implementation_is_chosen_per_band_of_chunk_lengths():
    seen = []

    def recording(name):
        def prefill(out, query, key_cache, value_cache, meta, scale, seqs):
            seen.append((name, query.shape[0], meta.seq_lens_host[0] - query.shape[0]))

        return prefill

    impls = {"native": recording("native"), "sdpa": recording("sdpa")}

    def timer(fn):  # native is faster below 100 rows, sdpa above, whatever the prefix
        seen.clear()
        fn()
        name, rows, _ = seen[0]
        return 1.0 if (name == "native") == (rows < 100) else 2.0

    choice = choose_prefill(impls, AttentionShapes(4, 2, 16, 16), torch.float32, timer)
    assert choice == ("native", "native", "native", "native", "sdpa", "sdpa")
    assert len(choice) == len(BANDS)


@needs_kernels
def test_the_timed_chunk_is_a_real_prefill_both_implementations_agree_on():
    shapes = AttentionShapes(6, 2, 32, 16)
    chunk = timed_chunk(shapes, 40, 100, torch.float32)
    outs = []
    for impl in prefill_impls(kernels).values():
        out = torch.zeros_like(chunk.query)
        impl(out, chunk.query, chunk.key_cache, chunk.value_cache, chunk.meta, 32**-0.5, [0])
        outs.append(out)
    assert outs[0].abs().sum() > 0
    torch.testing.assert_close(outs[0], outs[1], atol=2e-5, rtol=2e-5)


@needs_kernels
def test_bad_sequence_ids_are_refused():
    q, k, v, kc, vc, meta = _step([5], [5], 4, 2, 64, torch.float32, seed=1)
    out = torch.empty_like(q)
    with pytest.raises(RuntimeError, match="seqs out of range"):
        kernels.paged_prefill_attention(q, kc, vc, meta.block_tables, meta.seq_lens, meta.query_start_loc,
                                        torch.tensor([1]), 0.125, out)  # fmt: skip
