"""Each rank's slices of every sharded weight fit back together into the full weight."""

import pytest
import torch
from safetensors import safe_open

from engine.config import EngineConfig, ModelConfig
from engine.model_runner import load_model
from engine.parallel.group import TPGroup
from engine.parallel.shard import even_slice, gate_up_slices, kv_head_slice, num_kv_heads_per_rank, qkv_slices
from engine.weight_loader import checkpoint_files

# (num_heads, num_kv_heads, tp_size): split KV heads, one each, and replicated KV heads
SHAPES = [(8, 8, 2), (8, 4, 4), (8, 2, 2), (8, 2, 4), (8, 1, 2), (8, 1, 8), (4, 2, 4), (12, 4, 1)]


def _rows(s):
    return list(range(s.start, s.stop))


@pytest.mark.parametrize("num_heads,num_kv_heads,tp", SHAPES)
def test_qkv_slices_cover_every_head_and_pair_q_with_its_kv_head(num_heads, num_kv_heads, tp):
    head_dim = 4
    per_rank = [qkv_slices(num_heads, num_kv_heads, head_dim, tp, r) for r in range(tp)]
    assert sum((_rows(q) for q, _, _ in per_rank), []) == list(range(num_heads * head_dim))
    kv_rows = [_rows(k) for _, k, _ in per_rank]
    assert all(k == v for _, k, v in per_rank)
    if num_kv_heads >= tp:
        assert sum(kv_rows, []) == list(range(num_kv_heads * head_dim))
    else:  # each KV head replicated on tp / num_kv_heads consecutive ranks
        assert [kv_head_slice(num_kv_heads, tp, r).start for r in range(tp)] == [
            r * num_kv_heads // tp for r in range(tp)
        ]
        assert {tuple(k) for k in kv_rows} == {tuple(range(h * head_dim, (h + 1) * head_dim)) for h in range(num_kv_heads)}
    group = num_heads // num_kv_heads  # HF GQA: q head h attends to KV head h // group
    for r in range(tp):
        q_heads, kv_heads = even_slice(num_heads, tp, r), kv_head_slice(num_kv_heads, tp, r)
        assert kv_heads.size == num_kv_heads_per_rank(num_kv_heads, tp)
        assert {h // group for h in _rows(q_heads)} <= set(_rows(kv_heads))
        # and the rank's local GQA grouping (q_local // (q per rank / kv per rank)) picks the same head
        local_group = q_heads.size // kv_heads.size
        assert all(kv_heads.start + i // local_group == h // group for i, h in enumerate(_rows(q_heads)))


def test_gate_up_slices_cover_the_intermediate_size():
    parts = [gate_up_slices(96, 4, r) for r in range(4)]
    assert all(g == u for g, u in parts)
    assert sum((_rows(g) for g, _ in parts), []) == list(range(96))


def _checkpoint(model_dir):
    tensors = {}
    for path in checkpoint_files(model_dir):
        with safe_open(path, framework="pt") as f:
            tensors.update({name.removeprefix("model."): f.get_tensor(name) for name in f.keys()})
    return tensors


def _shards(model_dir, tp):
    config = EngineConfig(model_dir=model_dir, model=ModelConfig.from_pretrained(model_dir))
    return [load_model(config, show_progress=False, tp=TPGroup(size=tp, rank=r)) for r in range(tp)]


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])  # qkv bias, 2 KV heads; q/k norm, 1 KV head (replicated)
def test_sharded_loading_reassembles_the_checkpoint(tiny_model_dirs, arch):
    """The loader's per-rank shards concatenate back to the checkpoint's q/k/v, gate/up, o and down."""
    model_dir, tp = tiny_model_dirs[arch], 2
    full, ranks = _checkpoint(model_dir), _shards(model_dir, tp)
    cfg = ranks[0].config
    hd, q_rows = cfg.head_dim, cfg.num_heads * cfg.head_dim // tp
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        attn = [m.layers[i].self_attn for m in ranks]
        mlp = [m.layers[i].mlp for m in ranks]
        params = ["weight", "bias"] if cfg.qkv_bias else ["weight"]
        for param in params:
            qkv = [a.qkv_proj.dense_weight() if param == "weight" else a.qkv_proj.bias for a in attn]
            torch.testing.assert_close(torch.cat([t[:q_rows] for t in qkv]), full[p + f"self_attn.q_proj.{param}"])
            for name, part in (("k", 0), ("v", 1)):
                pieces = [t[q_rows:].chunk(2)[part] for t in qkv]
                ckpt = full[p + f"self_attn.{name}_proj.{param}"]
                for r, piece in enumerate(pieces):
                    kv = kv_head_slice(cfg.num_kv_heads, tp, r).scaled(hd)
                    torch.testing.assert_close(piece, ckpt[kv.start : kv.stop])
        torch.testing.assert_close(torch.cat([a.o_proj.dense_weight() for a in attn], 1), full[p + "self_attn.o_proj.weight"])
        gate_up = [m.gate_up_proj.dense_weight().chunk(2) for m in mlp]
        torch.testing.assert_close(torch.cat([g for g, _ in gate_up]), full[p + "mlp.gate_proj.weight"])
        torch.testing.assert_close(torch.cat([u for _, u in gate_up]), full[p + "mlp.up_proj.weight"])
        torch.testing.assert_close(torch.cat([m.down_proj.dense_weight() for m in mlp], 1), full[p + "mlp.down_proj.weight"])
        if cfg.qk_norm:  # per-head norms: replicated
            for a in attn:
                torch.testing.assert_close(a.q_norm.weight, full[p + "self_attn.q_norm.weight"])
    for m in ranks:  # replicated: embedding and (tied) lm_head
        torch.testing.assert_close(m.embed_tokens.weight, full["embed_tokens.weight"])
        assert m.layers[0].self_attn.num_heads == cfg.num_heads // tp
