"""The native layer ops agree with their PyTorch references (engine.layers.ops)."""

import pytest
import torch
import torch.nn.functional as F

from engine.attention.torch_backend import write_kv_cache
from engine.layers import ops
from tests.engine.native_kernels import native_kernels

kernels = native_kernels(module_level=True)
SHAPES = [(24, 40)]
PACKED = ("packed",) * 6  # every band of row counts on the native packed kernel
MIXED = ("mv", "few", "few", "dense", "packed", "packed")  # each candidate somewhere: both weight forms kept
NATIVE = ops.native_ops(kernels, torch.float32, SHAPES, MIXED)
NATIVE_F32 = ops.native_ops(kernels, torch.float32, SHAPES, PACKED)
DTYPES = [torch.float32, torch.bfloat16]


def _close(actual, expected, dtype):
    # float32: summation order only; bfloat16: at most one rounding step apart
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(actual, expected, **tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [1, 37])
def test_rms_norm_and_fused_residual_add(dtype, tokens):
    gen = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, 96, generator=gen).to(dtype)
    residual = torch.randn(tokens, 96, generator=gen).to(dtype)
    weight = torch.randn(96, generator=gen).to(dtype)
    _close(NATIVE.rms_norm(x, weight, 1e-6), ops.TORCH_OPS.rms_norm(x, weight, 1e-6), dtype)

    expected_out, expected_res = ops.TORCH_OPS.add_rms_norm(x, residual.clone(), weight, 1e-6)
    res = residual.clone()
    out, new_res = NATIVE.add_rms_norm(x, res, weight, 1e-6)
    assert new_res is res  # updated in place: the layer carries one residual buffer
    torch.testing.assert_close(new_res, expected_res, atol=0, rtol=0)  # one add, same rounding
    _close(out, expected_out, dtype)


def test_rms_norm_reads_strided_rows():
    x = torch.randn(5, 200)[:, :64]  # rows contiguous, row stride 200
    w = torch.randn(64)
    _close(NATIVE.rms_norm(x, w, 1e-5), ops.TORCH_OPS.rms_norm(x, w, 1e-5), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [32, 64])
def test_rotary_in_place_matches_reference(dtype, head_dim):
    gen = torch.Generator().manual_seed(head_dim)
    qkv = torch.randn(7, 4 + 2 + 2, head_dim, generator=gen).to(dtype)  # 4 q heads, 2 k, 2 v
    cos = torch.randn(7, head_dim, generator=gen).to(dtype)
    sin = torch.randn(7, head_dim, generator=gen).to(dtype)
    expected = ops.TORCH_OPS.rotary(qkv, 6, cos, sin)
    v_before = qkv[:, 6:].clone()
    out = NATIVE.rotary(qkv, 6, cos, sin)
    assert out.data_ptr() == qkv.data_ptr()  # in place
    _close(out, expected, dtype)
    torch.testing.assert_close(qkv[:, 6:], v_before, atol=0, rtol=0)  # V heads untouched


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul(dtype):
    gate_up = (torch.randn(9, 2 * 48) * 4).to(dtype)
    _close(NATIVE.silu_and_mul(gate_up), ops.TORCH_OPS.silu_and_mul(gate_up), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_write_kv_cache_is_bit_exact_and_skips_empty_slots(dtype):
    qkv = torch.randn(6, 3 * 2, 8).to(dtype)  # key and value are strided views, as in the model
    key, value = qkv[:, 2:4], qkv[:, 4:6]
    slots = torch.tensor([5, -1, 0, 17, -1, 30])
    caches = [torch.zeros(4, 8, 2, 8, dtype=dtype) for _ in range(4)]
    write_kv_cache(key, value, caches[0], caches[1], slots)
    kernels.write_kv_cache(key, value, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


def test_write_kv_cache_rejects_slot_outside_cache():
    kv = torch.randn(1, 2, 8)
    cache = torch.zeros(2, 4, 2, 8)
    with pytest.raises(RuntimeError, match="outside the cache"):
        kernels.write_kv_cache(kv, kv, cache, cache.clone(), torch.tensor([8]))


@pytest.mark.parametrize("rows", [0, 1, 3, 8, 9, 40, 100, 300])  # 0: a step of prompt chunks that samples nothing
def test_each_band_runs_its_chosen_kernel_and_all_match_f_linear(rows):
    x, w, b = torch.randn(rows, 40), torch.randn(24, 40), torch.randn(24)
    prepared = NATIVE.prepare_weight(w)
    assert isinstance(prepared, ops.LinearForms) and torch.equal(ops.dense_weight(prepared), w)
    _close(NATIVE.linear(x, prepared, b), F.linear(x, w, b), torch.float32)
    _close(NATIVE.linear(x, prepared), F.linear(x, w), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 4, 16, 33])
def test_every_candidate_matches_f_linear(dtype, rows):
    x, w, b = (torch.randn(*shape).to(dtype) for shape in ((rows, 40), (24, 40), (24,)))
    pack, _ = ops.make_packed_linear(kernels)
    for candidate in ops.linear_candidates(kernels, dtype):
        if candidate.max_rows >= rows:
            weight = pack(w) if candidate.form == "packed" else w
            _close(candidate.run(x, weight, b), F.linear(x, w, b), dtype)


# Rows: none, one, a partial block, 16 (two blocks of 8), 25 (three blocks), many (L2 groups).
@pytest.mark.parametrize("rows", [0, 1, 5, 12, 16, 25, 130])
def test_packed_linear_matches_f_linear(rows):
    # 70 outputs: two full 32-wide panels and a partial one; 37 inputs: no vector-width multiple
    gen = torch.Generator().manual_seed(rows)
    x, w, b = (torch.randn(*shape, generator=gen) for shape in ((rows, 37), (70, 37), (70,)))
    packed = NATIVE_F32.prepare_weight(w)
    assert isinstance(packed, ops.PackedWeight) and packed.data.shape == (3, 37, 32)
    _close(NATIVE_F32.linear(x, packed, b), F.linear(x, w, b), torch.float32)
    _close(NATIVE_F32.linear(x, packed), F.linear(x, w), torch.float32)


def test_packed_weight_unpacks_exactly_and_takes_strided_rows():
    w = torch.randn(600, 96)
    packed = NATIVE_F32.prepare_weight(w)
    assert torch.equal(ops.dense_weight(packed), w)
    x = torch.randn(40, 3, 96)[:, 1]  # rows 288 floats apart
    _close(NATIVE_F32.linear(x, packed), F.linear(x, w), torch.float32)
    with pytest.raises(RuntimeError, match="out_features"):
        kernels.packed_linear(x, packed.data, 500)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 2, 5, 16])
def test_small_linear_kernel(dtype, rows):
    # in_features 100: six full 16-lane chunks plus a remainder of 4
    x, w, b = (torch.randn(*shape).to(dtype) for shape in ((rows, 100), (130, 100), (130,)))
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=0.1, rtol=2e-2)
    torch.testing.assert_close(kernels.small_linear(x, w, b), F.linear(x, w, b), **tol)
    torch.testing.assert_close(kernels.small_linear(x, w), F.linear(x, w), **tol)
    with pytest.raises(RuntimeError, match="1 to 16 rows"):
        kernels.small_linear(torch.randn(17, 100).to(dtype), w)
