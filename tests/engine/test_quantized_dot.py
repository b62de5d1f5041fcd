"""The integer dot-product kernel over GGUF blocks (activations quantized to int8 per block, VNNI, the blocks
repacked into panels of 16 outputs: engine.quantized_panels, quantized_panels.cpp) against its PyTorch
reference (`engine.quantized_weight.int8_activation_linear`), and that reference against the float product it
approximates."""

import pytest
import torch
import torch.nn.functional as F

from engine.layers.ops import dense_makers, linear_candidates
from engine.layers.quantized_choice import chosen_quantized_linear, quantized_candidates
from engine.quantized_panels import pack_int8_panels
from engine.quantized_weight import BLOCK, QTYPES, dequantize, int8_activation_linear, quantize, quantize_activations
from tests.engine.native_kernels import native_kernels

kernels = native_kernels(module_level=True)
needs_vnni = pytest.mark.skipif(not kernels.int8_dot_built(), reason="no AVX512-VNNI in this build")


def _close(out: torch.Tensor, ref: torch.Tensor, tolerance: float) -> None:
    """Within `tolerance` of the reference's largest value: the kernel sums in float32 and its quantizer may
    round a code a reference code lies next to at a tie (1 in ~10^6 codes, a row's outputs ~1e-4 off)."""
    worst = ((out.float() - ref).abs().max() / ref.abs().max()).item()
    assert worst < tolerance, worst


def _panels_linear(x, panels, bias=None):
    return kernels.quantized_panels_linear(x, panels.qtype, panels.codes, panels.scales, panels.extra,
                                           panels.out_features, bias)  # fmt: skip


def test_a_panel_holds_four_weights_of_each_output_per_lane():
    torch.manual_seed(12)
    for qtype in QTYPES:
        weight = quantize(torch.randn(20, 2 * BLOCK), qtype)
        panels = pack_int8_panels(weight)
        q = torch.stack([(weight.codes.view(20, 2, 32 if qtype == "Q8_0" else 16)[o, 1]) for o in range(20)])
        o, k, t = 17, 2, 3  # output 17 is lane 1 of panel 1; weights 4k + t of its block 1
        lane = panels.codes[1, 1].view(-1, 16, 4)[k, o - 16, t].item()
        if qtype == "Q8_0":
            assert panels.codes.shape == (2, 2, 512) and lane == q[o, 4 * k + t].item()
            assert panels.extra[1, 1, o - 16].item() == 128 * q[o].int().sum().item()
        else:  # weight 4k + t in the low nibble, weight 16 + 4k + t in the high one
            byte = q[o, 4 * k + t].item()  # the file's byte j: weight j (low), j + 16 (high)
            assert panels.codes.shape == (2, 2, 256) and lane == byte
        assert panels.scales[1, 1, o - 16] == weight.scales[o, 1].float() and panels.scales[1, 1, 4:].eq(0).all()


@needs_vnni
@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("rows", [1, 2, 3, 8, 9, 16, 17, 40])
def test_the_kernel_is_its_references_integer_product(qtype, rows):
    torch.manual_seed(rows + 20)
    blocks = 5 if rows % 2 else 6
    weight = quantize(torch.randn(37, blocks * BLOCK), qtype)  # 3 panels, the last one 5 outputs
    x = torch.randn(rows, blocks * BLOCK)
    bias = torch.randn(37) if rows % 3 else None
    out = _panels_linear(x, pack_int8_panels(weight), bias)
    assert out.dtype == torch.float32 and out.shape == (rows, 37)
    _close(out, int8_activation_linear(x, weight, bias), 1e-3)


@needs_vnni
@pytest.mark.parametrize("qtype", QTYPES)
def test_bfloat16_activations_are_read_and_written_as_they_are(qtype):
    torch.manual_seed(7)
    weight = quantize(torch.randn(64, 4 * BLOCK), qtype)
    x, bias = torch.randn(5, 4 * BLOCK).to(torch.bfloat16), torch.randn(64).to(torch.bfloat16)
    out = _panels_linear(x, pack_int8_panels(weight), bias)
    assert out.dtype == torch.bfloat16
    _close(out, int8_activation_linear(x, weight, bias), 1e-2)  # the result rounded to bfloat16


@needs_vnni
def test_rows_of_a_wider_tensor_and_all_zero_blocks_are_read_as_they_are():
    torch.manual_seed(8)
    weight = quantize(torch.randn(24, 2 * BLOCK), "Q4_1")
    wide = torch.randn(4, 3 * BLOCK)
    wide[1, :BLOCK] = 0  # a block of zeros: scale 0, no division by it
    x = wide[:, : 2 * BLOCK]
    _close(_panels_linear(x, pack_int8_panels(weight)), int8_activation_linear(x, weight), 1e-3)


@needs_vnni
def test_panels_of_the_wrong_shape_or_kind_are_refused_with_the_reason():
    panels = pack_int8_panels(quantize(torch.randn(20, BLOCK), "Q4_1"))
    x = torch.randn(2, BLOCK)
    with pytest.raises(RuntimeError, match="Q4_1 panels take their offsets"):
        kernels.quantized_panels_linear(x, "Q4_1", panels.codes, panels.scales, None, 20)
    with pytest.raises(RuntimeError, match="must fill the last of the panels"):
        kernels.quantized_panels_linear(x, "Q4_1", panels.codes, panels.scales, panels.extra, 40)
    with pytest.raises(RuntimeError, match="must be Q8_0, Q4_0 or Q4_1"):
        kernels.quantized_panels_linear(x, "Q6_K", panels.codes, panels.scales, panels.extra, 20)
    with pytest.raises(RuntimeError, match="in = the weight's in_features"):
        _panels_linear(torch.randn(2, 2 * BLOCK), panels)
    with pytest.raises(RuntimeError, match="float32 and bfloat16"):
        _panels_linear(x.half(), panels)


@pytest.mark.skipif(kernels.int8_dot_built(), reason="this build has AVX512-VNNI")
def test_a_build_without_vnni_says_so():
    panels = pack_int8_panels(quantize(torch.randn(8, BLOCK), "Q8_0"))
    with pytest.raises(RuntimeError, match="needs AVX512-VNNI"):
        _panels_linear(torch.randn(1, BLOCK), panels)


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
    assert "int8-panels" not in [c.name for c in quantized_candidates(kernels)]  # "gguf": the float products
    assert "int8-panels" in [c.name for c in quantized_candidates(kernels, int8_activations=True)]
    torch.manual_seed(11)
    weight = quantize(torch.randn(48, 4 * BLOCK), "Q4_1")
    linear, prepare, described = chosen_quantized_linear(
        kernels, torch.bfloat16, {"Q4_1": [weight.shape]}, [], linear_candidates(kernels, torch.bfloat16),
        dense_makers(kernels), {"Q4_1": ["blocks"] * 3 + ["int8-panels"] * 3}, int8_activations=True)  # fmt: skip
    forms = prepare(weight, dequantize(weight).to(torch.bfloat16))
    assert set(forms.forms) == {"quantized", "int8_panels"}
    assert "Q4_1: 1 row: blocks, 2-4 rows: blocks, 5-16 rows: blocks, 17-64 rows: int8-panels" in described
    x = torch.randn(20, 4 * BLOCK).to(torch.bfloat16)  # a band of the panels
    out = linear(x, forms)
    assert out.dtype == torch.bfloat16
    _close(out, int8_activation_linear(x, weight), 1e-2)
