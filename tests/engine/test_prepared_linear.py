"""A linear layer after `prepare(ops)`: the PyTorch ops keep the loaded parameter; packing replaces it,
and a choice that reads both forms keeps one packed and one dense copy."""

import pytest
import torch
import torch.nn.functional as F

from engine.layers.linear import ColumnParallelLinear
from engine.layers.ops import TORCH_OPS, LinearForms, PackedWeight, native_ops, onednn_works
from tests.engine.native_kernels import native_kernels
from engine.parallel.shard import Slice
from engine.quantized_weight import dequantize, quantize


def _linear(weight: torch.Tensor) -> ColumnParallelLinear:
    out_features, in_features = weight.shape
    layer = ColumnParallelLinear(in_features, (out_features,), (Slice(0, out_features),), bias=False)
    layer.weight.data.copy_(weight)
    return layer


def test_torch_ops_keep_the_parameter():
    weight, x = torch.randn(40, 24), torch.randn(3, 24)
    layer = _linear(weight)
    layer.prepare(TORCH_OPS)
    assert layer.weight is not None and layer.kernel_weight.data_ptr() == layer.weight.data_ptr()
    torch.testing.assert_close(layer.project(TORCH_OPS, x), F.linear(x, weight))


def test_packing_replaces_the_parameter_and_a_mixed_choice_keeps_both_forms():
    kernels = native_kernels()
    weight, x = torch.randn(40, 24), torch.randn(3, 24)
    for choice, form in ((("packed",) * 6, PackedWeight), (("dense",) * 6, torch.Tensor),
                         (("mv",) + ("packed",) * 5, LinearForms)):  # fmt: skip
        ops = native_ops(kernels, torch.float32, [(40, 24)], choice)
        layer = _linear(weight)
        layer.prepare(ops)
        assert isinstance(layer.kernel_weight, form)
        assert (layer.weight is None) == (form is not torch.Tensor)  # one dense copy at most, wherever it is
        assert torch.equal(layer.dense_weight(), weight)
        torch.testing.assert_close(layer.project(ops, x), F.linear(x, weight), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_onednn_prepacked_weights_serve_their_bands_beside_the_other_forms(dtype):
    kernels = native_kernels()
    if not onednn_works(dtype):
        pytest.skip("oneDNN's prepacked linear is not available here")
    weight = torch.randn(40, 24).to(dtype)
    mixed = ("mv", "few", "onednn", "onednn", "dense", "onednn")
    for choice, forms in ((("onednn",) * 6, None), (mixed, {"dense", "onednn"})):
        ops = native_ops(kernels, dtype, [(40, 24)], choice)
        layer = _linear(weight).to(dtype)
        layer.prepare(ops)
        if forms is None:
            assert layer.kernel_weight.is_mkldnn and layer.weight is None  # oneDNN's copy replaces the parameter
        else:
            assert isinstance(layer.kernel_weight, LinearForms) and set(layer.kernel_weight.forms) == forms
        assert torch.equal(layer.dense_weight(), weight)
        for rows in (1, 3, 20, 300):  # a band of each kernel
            x = torch.randn(rows, 24).to(dtype)
            tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
            torch.testing.assert_close(layer.project(ops, x), F.linear(x, weight), **tol)


def test_gguf_blocks_replace_the_parameter_and_widen_back_to_it():
    kernels = native_kernels()
    blocks = quantize(torch.randn(40, 64), "Q4_1")
    layer = _linear(dequantize(blocks))
    layer.quantized = blocks  # as engine.gguf_weights attaches them
    ops = native_ops(kernels, torch.float32, [], ("dense",) * 6, quantized_shapes={"Q4_1": [blocks.shape]},
                     quantized_choice={"Q4_1": ("blocks",) * 6})  # fmt: skip
    layer.prepare(ops)
    assert list(layer.kernel_weight.forms) == ["quantized"] and layer.weight is None
    assert layer.kernel_weight.forms["quantized"].scales.dtype == torch.float32  # as the kernels take them
    assert torch.equal(layer.dense_weight(), dequantize(blocks))
    x = torch.randn(3, 64)
    torch.testing.assert_close(layer.project(ops, x), F.linear(x, dequantize(blocks)), atol=1e-4, rtol=1e-5)
