"""Loader errors name the file and the tensor; configs reject unknown architectures."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import LLM, SamplingParams
from engine.config import ModelConfig
from engine.weight_loader import WeightLoadError


def _copy(src, tmp_path):
    dst = tmp_path / "model"
    shutil.copytree(src, dst)
    return dst


def test_unknown_architecture_is_a_clear_error(tiny_model_dirs, tmp_path):
    d = _copy(tiny_model_dirs["qwen2"], tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="unsupported architecture.*GPT2LMHeadModel"):
        ModelConfig.from_pretrained(d)


def test_missing_config_and_missing_weights(tiny_model_dirs, tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        ModelConfig.from_pretrained(tmp_path)
    d = _copy(tiny_model_dirs["qwen2"], tmp_path)
    (d / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="safetensors"):
        LLM(str(d), num_kv_blocks=8, dtype="float32")


def test_missing_shard_named(tiny_model_dirs, tmp_path):
    d = _copy(tiny_model_dirs["llama"], tmp_path)
    shard = sorted(d.glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(FileNotFoundError, match=shard.name):
        LLM(str(d), num_kv_blocks=8, dtype="float32")


def test_shape_mismatch_names_file_and_tensor(tiny_model_dirs, tmp_path):
    d = _copy(tiny_model_dirs["qwen2"], tmp_path)
    tensors = load_file(d / "model.safetensors")
    name = "model.layers.1.self_attn.k_proj.weight"
    tensors[name] = torch.zeros(7, 64)
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(WeightLoadError, match=rf"model.safetensors.*{name}.*\(7, 64\)"):
        LLM(str(d), num_kv_blocks=8, dtype="float32")


def test_missing_tensor_is_reported(tiny_model_dirs, tmp_path):
    d = _copy(tiny_model_dirs["qwen2"], tmp_path)
    tensors = load_file(d / "model.safetensors")
    del tensors["model.layers.0.mlp.up_proj.weight"]
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(WeightLoadError, match="layers.0.mlp.gate_up_proj.weight"):
        LLM(str(d), num_kv_blocks=8, dtype="float32")


def test_bfloat16_loads_and_generates(tiny_model_dirs):
    llm = LLM(tiny_model_dirs["llama"], dtype="bfloat16", num_kv_blocks=16)
    assert llm.engine.runner.model.embed_tokens.weight.dtype == torch.bfloat16
    assert llm.engine.runner.kv_caches[0][0].dtype == torch.bfloat16
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    out = llm.generate({"prompt_token_ids": [3, 4, 5]}, params, use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == 16


def test_kv_cache_sized_from_memory_budget(tiny_model_dirs):
    llm = LLM(tiny_model_dirs["llama"], kv_cache_memory=1 << 20, block_size=16, dtype="float32")
    cfg = llm.engine.config.model
    per_block = 2 * cfg.num_layers * 16 * cfg.num_kv_heads * cfg.head_dim * 4
    assert llm.engine.runner.num_blocks == (1 << 20) // per_block
