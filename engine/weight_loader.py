"""Load Hugging Face safetensors checkpoints into our fused-layout model, tensor by tensor.

Checkpoint names map to (our parameter, row offset) pairs: q/k/v go into
`qkv_proj` one after another, gate/up into `gate_up_proj`. Every tensor's
shape is checked before it is copied; an error names the file and the tensor.
"""

import json
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm import tqdm

# checkpoint suffix -> (our module suffix, index of the shard in the fused matrix)
_FUSED = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
}
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class WeightLoadError(ValueError):
    pass


def checkpoint_files(model_dir: str | Path) -> list[Path]:
    """The safetensors files of a model directory, via the shard index when there is one."""
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [model_dir / n for n in names]
        for f in files:
            if not f.is_file():
                raise FileNotFoundError(f"{f}: listed in {index.name} but missing")
        return files
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir}: no *.safetensors weights found")
    return files


def load_weights(model: torch.nn.Module, model_dir: str | Path, show_progress: bool = True) -> None:
    cfg = model.config
    params = dict(model.named_parameters(remove_duplicate=False))
    shard_sizes = _fused_shard_sizes(cfg)
    loaded: set[str] = set()
    files = checkpoint_files(model_dir)
    total = sum(len(safe_open(f, "pt").keys()) for f in files)
    with tqdm(total=total, desc="Loading weights", unit="tensor", disable=not show_progress) as bar:
        for path in files:
            with safe_open(path, framework="pt") as f:
                for name in f.keys():
                    _load_one(name, f, path, params, shard_sizes, loaded)
                    bar.update(1)
    _check_complete(params, loaded, cfg, model_dir)


def _fused_shard_sizes(cfg) -> dict[str, list[int]]:
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    return {"self_attn.qkv_proj": [q, kv, kv], "mlp.gate_up_proj": [cfg.intermediate_size] * 2}


def _target(name: str) -> tuple[str, str | None, int]:
    """Checkpoint tensor name -> (our parameter name, fused module suffix or None, shard index)."""
    ours = name.removeprefix("model.")
    for suffix, (fused, shard) in _FUSED.items():
        marker = f".{suffix}."
        if marker in ours:
            return ours.replace(marker, f".{fused}."), fused, shard
    return ours, None, 0


def _load_one(name, f, path, params, shard_sizes, loaded) -> None:
    if name.endswith(_IGNORED_SUFFIXES):
        return
    ours, fused, shard = _target(name)
    if ours not in params:
        raise WeightLoadError(f"{path.name}: tensor {name!r} has no place in the model (expected {ours!r})")
    param = params[ours]
    tensor = f.get_tensor(name)
    dest = param.data
    if fused is not None:
        sizes = shard_sizes[fused]
        dest = dest.narrow(0, sum(sizes[:shard]), sizes[shard])
    if tuple(tensor.shape) != tuple(dest.shape):
        raise WeightLoadError(
            f"{path.name}: tensor {name!r} has shape {tuple(tensor.shape)}, model expects {tuple(dest.shape)}"
        )
    dest.copy_(tensor)
    loaded.add(f"{ours}#{shard}")


def _num_shards(param_name: str, shard_sizes: dict[str, list[int]]) -> int:
    fused = next((k for k in shard_sizes if f".{k}." in param_name), None)
    return len(shard_sizes[fused]) if fused else 1


def _check_complete(params, loaded, cfg, model_dir) -> None:
    shard_sizes = _fused_shard_sizes(cfg)
    missing = sorted(
        name
        for name in params
        if any(f"{name}#{s}" not in loaded for s in range(_num_shards(name, shard_sizes)))
        and not (cfg.tie_word_embeddings and name == "lm_head.weight")
    )
    if missing:
        raise WeightLoadError(f"{model_dir}: checkpoint lacks tensors for {missing[:8]}")
