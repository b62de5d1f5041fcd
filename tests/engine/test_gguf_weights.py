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
