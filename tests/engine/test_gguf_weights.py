"""Which GGUF tensors are served in blocks, under which checkpoint names, and in which row order."""

import pytest
import torch

from engine.gguf_weights import attach_gguf_blocks, checkpoint_name, gguf_source, rotary_halves_order


@pytest.mark.parametrize("gguf_name, ours", [
    ("blk.3.attn_q.weight", "model.layers.3.self_attn.q_proj.weight"),
    ("blk.12.ffn_down.weight", "model.layers.12.mlp.down_proj.weight"),
    ("blk.0.attn_output.weight", "model.layers.0.self_attn.o_proj.weight"),
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output.weight", "lm_head.weight"),
    ("blk.0.attn_norm.weight", None),
    ("blk.0.attn_q.bias", None),
])
def test_gguf_names_map_to_the_converted_checkpoints(gguf_name, ours):
    assert checkpoint_name(gguf_name) == ours


@pytest.mark.parametrize("heads", [1, 3, 4])
def test_the_rotary_order_undoes_llama_cpps_interleaving_of_each_heads_halves(heads):
    head_dim, width = 8, 5
    checkpoint = torch.arange(heads * head_dim * width, dtype=torch.float32).reshape(heads * head_dim, width)
    # llama.cpp's converter: each head's rows [0, half) and [half, head_dim) laid out as pairs (i, half + i)
    in_file = checkpoint.reshape(heads, 2, head_dim // 2, width).transpose(1, 2).reshape(checkpoint.shape)
    assert torch.equal(in_file[rotary_halves_order(heads * head_dim, heads)], checkpoint)


def test_a_model_not_converted_from_a_gguf_file_keeps_its_dense_weights(tiny_model_dirs):
    assert gguf_source(tiny_model_dirs["llama"]) is None
    assert attach_gguf_blocks(torch.nn.Module(), tiny_model_dirs["llama"]) == {}


def _in_llama_cpp_order(weight, heads: int):
    rows = weight.out_features
    file_row_holds = torch.arange(rows).reshape(heads, 2, rows // heads // 2).transpose(1, 2).reshape(-1)
    return weight.permuted_rows(file_row_holds)


def test_a_tensor_parallel_rank_takes_its_rows_and_whole_blocks_of_columns_in_the_loaded_order():
    """Rank 1 of 2: its halves of q (two heads, in llama.cpp's order in the file), k and v (one KV head, so
    half of its rows), and of a row-parallel weight's columns; a shard that cuts a block stays dense."""
    from types import SimpleNamespace

    from engine.gguf_weights import _shard
    from engine.layers.linear import ColumnParallelLinear, RowParallelLinear
    from engine.parallel.shard import Slice
    from engine.quantized_weight import dequantize, quantize

    torch.manual_seed(0)
    cfg = SimpleNamespace(num_heads=2, num_kv_heads=1)
    q, k, v = (quantize(torch.randn(rows, 64), "Q4_1") for rows in (16, 8, 8))
    qkv = ColumnParallelLinear(64, (16, 8, 8), (Slice(8, 8), Slice(4, 4), Slice(4, 4)), bias=False)
    qkv.weight.data.copy_(torch.cat([dequantize(q)[8:], dequantize(k)[4:], dequantize(v)[4:]]))
    in_file = {0: _in_llama_cpp_order(q, 2), 1: _in_llama_cpp_order(k, 1), 2: v}
    shard = _shard(qkv, in_file, cfg, "layers.0.self_attn.qkv_proj")
    assert shard is not None and torch.equal(dequantize(shard), qkv.weight.data)

    full = quantize(torch.randn(40, 128), "Q8_0")
    down = RowParallelLinear(128, Slice(64, 64), 40, all_reduce=None)
    down.weight.data.copy_(dequantize(full)[:, 64:])
    assert torch.equal(dequantize(_shard(down, {0: full}, cfg, "layers.0.mlp.down_proj")), down.weight.data)
    cut = RowParallelLinear(128, Slice(48, 80), 40, all_reduce=None)
    cut.weight.data.copy_(dequantize(full)[:, 48:])
    assert _shard(cut, {0: full}, cfg, "layers.0.mlp.down_proj") is None
