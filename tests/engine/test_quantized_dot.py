"""The integer dot-product kernel over GGUF blocks (quantized_dot.cpp: activations quantized to int8 per
block, VNNI) against its PyTorch reference (`engine.quantized_weight.int8_activation_linear`), and that
reference against the float product it approximates."""

import pytest
import torch
import torch.nn.functional as F

from engine.layers.ops import dense_makers, linear_candidates
from engine.layers.quantized_choice import chosen_quantized_linear, quantized_candidates
from engine.quantized_weight import BLOCK, QTYPES, dequantize, int8_activation_linear, quantize, quantize_activations
from tests.engine.native_kernels import native_kernels

kernels = native_kernels(module_level=True)
needs_vnni = pytest.mark.skipif(not kernels.int8_dot_built(), reason="no AVX512-VNNI in this build")


def _close(out: torch.Tensor, ref: torch.Tensor, tolerance: float) -> None:
    """Within `tolerance` of the reference's largest value: the kernel sums in float32 and its quantizer may
    round a code a reference code lies next to at a tie (1 in ~10^6 codes, a row's outputs ~1e-4 off)."""
    worst = ((out.float() - ref).abs().max() / ref.abs().max()).item()
    assert worst < tolerance, worst


@needs_vnni
@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("rows", [1, 2, 3, 8, 16, 17, 40])
def test_the_kernel_is_its_references_integer_product(qtype, rows):
    torch.manual_seed(rows)
    blocks = 5 if rows % 2 else 6  # an odd last block pairs with zeros
    weight = quantize(torch.randn(37, blocks * BLOCK), qtype).for_kernels()
    x = torch.randn(rows, blocks * BLOCK)
    bias = torch.randn(37) if rows % 3 else None
    out = kernels.quantized_linear_int8(x, qtype, weight.codes, weight.scales, weight.offsets, bias)
    assert out.dtype == torch.float32 and out.shape == (rows, 37)
    _close(out, int8_activation_linear(x, weight, bias), 1e-3)


@needs_vnni
@pytest.mark.parametrize("qtype", QTYPES)
def test_bfloat16_activations_are_read_and_written_as_they_are(qtype):
    torch.manual_seed(7)
    weight = quantize(torch.randn(64, 4 * BLOCK), qtype).for_kernels()
    x, bias = torch.randn(5, 4 * BLOCK).to(torch.bfloat16), torch.randn(64).to(torch.bfloat16)
    out = kernels.quantized_linear_int8(x, qtype, weight.codes, weight.scales, weight.offsets, bias)
    assert out.dtype == torch.bfloat16
    _close(out, int8_activation_linear(x, weight, bias), 1e-2)  # the result rounded to bfloat16


@needs_vnni
def test_rows_of_a_wider_tensor_and_all_zero_blocks_are_read_as_they_are():
    torch.manual_seed(8)
    weight = quantize(torch.randn(24, 2 * BLOCK), "Q4_1").for_kernels()
    wide = torch.randn(4, 3 * BLOCK)
    wide[1, :BLOCK] = 0  # a block of zeros: scale 0, no division by it
    x = wide[:, : 2 * BLOCK]
    out = kernels.quantized_linear_int8(x, "Q4_1", weight.codes, weight.scales, weight.offsets)
    _close(out, int8_activation_linear(x, weight), 1e-3)


@needs_vnni
def test_blocks_of_the_wrong_kind_are_refused_with_the_reason():
    weight = quantize(torch.randn(8, BLOCK), "Q4_1").for_kernels()
    x = torch.randn(1, BLOCK)
    with pytest.raises(RuntimeError, match="offsets are for Q4_1 only"):
        kernels.quantized_linear_int8(x, "Q4_1", weight.codes, weight.scales, None)
    with pytest.raises(RuntimeError, match="must be Q8_0, Q4_0 or Q4_1"):
        kernels.quantized_linear_int8(x, "Q6_K", weight.codes, weight.scales)
    with pytest.raises(RuntimeError, match="in = the weight's in_features"):
        kernels.quantized_linear_int8(torch.randn(1, 2 * BLOCK), "Q4_1", weight.codes, weight.scales, weight.offsets)
    with pytest.raises(RuntimeError, match="float32 and bfloat16"):
        kernels.quantized_linear_int8(x.half(), "Q4_1", weight.codes, weight.scales, weight.offsets)


@pytest.mark.skipif(kernels.int8_dot_built(), reason="this build has AVX512-VNNI")
def test_a_build_without_vnni_says_so():
    weight = quantize(torch.randn(8, BLOCK), "Q8_0").for_kernels()
    with pytest.raises(RuntimeError, match="needs AVX512-VNNI"):
        kernels.quantized_linear_int8(torch.randn(1, BLOCK), "Q8_0", weight.codes, weight.scales)


def test_activations_quantize_to_int8_codes_within_half_a_step():
    torch.manual_seed(9)
    x = torch.randn(3, 4 * BLOCK) * torch.tensor([1e-3, 1.0, 50.0])[:, None]
    x[2, BLOCK : 2 * BLOCK] = 0
    codes, scales = quantize_activations(x)
    assert codes.dtype == torch.int8 and codes.abs().max() == 127 and scales[2, 1] == 0
    error = (codes.float() * scales[..., None] - x.reshape(3, 4, BLOCK)).abs()
    assert (error <= scales[..., None] / 2 * (1 + 1e-5)).all()


@pytest.mark.parametrize("qtype", QTYPES)
def test_the_reference_is_the_float_product_within_the_activations_rounding(qtype):
    """A block's activations rounded to 1/254 of their range: the product's error is well under 1%."""
    torch.manual_seed(10)
    weight = quantize(torch.randn(96, 18 * BLOCK), qtype)
    x = torch.randn(4, 18 * BLOCK)
    exact = F.linear(x.double(), dequantize(weight).double())
    error = (int8_activation_linear(x, weight).double() - exact).norm() / exact.norm()
    assert 1e-4 < error < 1e-2, error  # not exact: it rounds; not far: it rounds finely


@needs_vnni
def test_only_quantization_auto_offers_the_integer_kernel_and_a_band_it_serves_reads_bfloat16_as_it_is():
    assert "int8" not in [c.name for c in quantized_candidates(kernels)]  # "gguf": the float products only
    assert "int8" in [c.name for c in quantized_candidates(kernels, int8_activations=True)]
    torch.manual_seed(11)
    weight = quantize(torch.randn(48, 4 * BLOCK), "Q4_1")
    linear, prepare, described = chosen_quantized_linear(
        kernels, torch.bfloat16, {"Q4_1": [weight.shape]}, [], linear_candidates(kernels, torch.bfloat16),
        dense_makers(kernels), {"Q4_1": ["int8"] * 6}, int8_activations=True)  # fmt: skip
    forms = prepare(weight, dequantize(weight).to(torch.bfloat16))
    x = torch.randn(3, 4 * BLOCK).to(torch.bfloat16)
    out = linear(x, forms)
    assert out.dtype == torch.bfloat16 and "Q4_1: 1 row: int8, 2-4 rows: int8" in described
    _close(out, int8_activation_linear(x, forms.forms["quantized"]), 1e-2)
