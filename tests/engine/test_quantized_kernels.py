"""The native kernels over weights in GGUF blocks against their PyTorch reference: the widened weight's
product (`engine.quantized_weight.dequantize`), in float64."""

import pytest
import torch
import torch.nn.functional as F

from engine.layers.ops import LayerOps, dense_makers, dense_weight, linear_candidates, native_ops
from engine.layers.quantized_choice import BlockForms, chosen_quantized_linear
from engine.quantized_weight import BLOCK, QTYPES, dequantize, quantize
from tests.engine.native_kernels import native_kernels

kernels = native_kernels(module_level=True)


def _reference(x, weight, bias=None):
    out = F.linear(x.double(), dequantize(weight).double(), None if bias is None else bias.double())
    return out.float()


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("rows", [1, 2, 7, 8, 9, 20])
def test_the_blocks_kernel_is_the_widened_weights_product(qtype, rows):
    torch.manual_seed(rows)
    weight = quantize(torch.randn(72, 5 * BLOCK), qtype).for_kernels()
    x = torch.randn(rows, 5 * BLOCK)
    bias = torch.randn(72) if rows % 2 else None
    out = kernels.quantized_linear(x, qtype, weight.codes, weight.scales, weight.offsets, bias)
    torch.testing.assert_close(out, _reference(x, weight, bias), rtol=1e-5, atol=1e-4)


def test_rows_of_a_wider_tensor_are_read_in_place():
    torch.manual_seed(3)
    weight = quantize(torch.randn(40, 2 * BLOCK), "Q4_1").for_kernels()
    wide = torch.randn(5, 3 * BLOCK)
    x = wide[:, : 2 * BLOCK]  # rows contiguous, a stride of its own
    out = kernels.quantized_linear(x, "Q4_1", weight.codes, weight.scales, weight.offsets)
    torch.testing.assert_close(out, _reference(x, weight), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("qtype", QTYPES)
def test_widening_the_whole_weight_gives_the_references_values(qtype):
    torch.manual_seed(4)
    weight = quantize(torch.randn(33, 3 * BLOCK), qtype).for_kernels()
    widened = kernels.dequantize_blocks(qtype, weight.codes, weight.scales, weight.offsets)
    torch.testing.assert_close(widened, dequantize(weight), rtol=1e-6, atol=1e-7)  # one FMA may round once


def test_blocks_of_the_wrong_kind_are_refused_with_the_reason():
    weight = quantize(torch.randn(8, BLOCK), "Q4_1").for_kernels()
    x = torch.randn(1, BLOCK)
    with pytest.raises(RuntimeError, match="offsets are for Q4_1 only"):
        kernels.quantized_linear(x, "Q4_1", weight.codes, weight.scales, None)
    with pytest.raises(RuntimeError, match="codes must be contiguous int8"):
        kernels.quantized_linear(x, "Q8_0", weight.codes, weight.scales)
    with pytest.raises(RuntimeError, match="must be Q8_0, Q4_0 or Q4_1"):
        kernels.quantized_linear(x, "Q6_K", weight.codes, weight.scales)
    with pytest.raises(RuntimeError, match="scales must be contiguous float32"):
        kernels.quantized_linear(x, "Q4_1", weight.codes, weight.scales.half(), weight.offsets)
    with pytest.raises(RuntimeError, match="in = the weight's in_features"):
        kernels.quantized_linear(torch.randn(1, 2 * BLOCK), "Q4_1", weight.codes, weight.scales, weight.offsets)


@pytest.mark.parametrize("candidate", ["blocks", "widen"])
def test_each_candidate_takes_bfloat16_activations_in_float32_and_rounds_back(candidate):
    torch.manual_seed(5)
    weight = quantize(torch.randn(48, 4 * BLOCK), "Q4_1")
    linear, prepare, described = chosen_quantized_linear(
        kernels, torch.bfloat16, {"Q4_1": [weight.shape]}, [], linear_candidates(kernels, torch.bfloat16),
        dense_makers(kernels), {"Q4_1": [candidate] * 6})  # fmt: skip
    forms = prepare(weight, dequantize(weight).to(torch.bfloat16))
    assert set(forms.forms) == {"quantized"} and forms.forms["quantized"].codes is weight.codes  # no dense copy
    x = torch.randn(3, 4 * BLOCK).to(torch.bfloat16)
    out = linear(x, forms)
    assert out.dtype == torch.bfloat16 and candidate in described
    torch.testing.assert_close(out, _reference(x.float(), weight).to(torch.bfloat16))


def test_the_layer_ops_send_each_weight_to_its_own_kernel_and_a_band_won_by_a_dense_kernel_keeps_its_form():
    torch.manual_seed(6)
    dense, blocks = torch.randn(24, 2 * BLOCK), quantize(torch.randn(40, 2 * BLOCK), "Q8_0")
    chosen = ("blocks", "blocks", "widen", "packed", "packed", "dense")
    ops: LayerOps = native_ops(kernels, torch.float32, [tuple(dense.shape)], linear_choice=["dense"] * 6,
                               quantized_shapes={"Q8_0": [blocks.shape]}, quantized_choice={"Q8_0": chosen})
    prepared = ops.prepare_quantized(blocks, dequantize(blocks))
    assert isinstance(prepared, BlockForms) and set(prepared.forms) == {"quantized", "packed", "dense"}
    for rows in (1, 3, 20, 300):  # the blocks, then widened, then packed, then dense
        x = torch.randn(rows, 2 * BLOCK)
        torch.testing.assert_close(ops.linear(x, prepared), _reference(x, blocks), rtol=1e-5, atol=1e-4)
    x = torch.randn(2, 2 * BLOCK)
    torch.testing.assert_close(ops.linear(x, ops.prepare_weight(dense)), F.linear(x, dense))
    assert "GGUF blocks by rows: Q8_0: 1 row: blocks" in ops.name
    assert torch.equal(dense_weight(prepared), dequantize(blocks))
