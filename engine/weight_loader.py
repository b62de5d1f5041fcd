"""Load Hugging Face safetensors checkpoints into our fused, possibly sharded model, tensor by tensor.

Checkpoint names map to (our parameter, fused part) pairs: q/k/v are parts 0-2
of `qkv_proj`, gate/up parts 0-1 of `gate_up_proj`. Under tensor parallelism
each rank reads only its own rows (column-parallel) or columns (row-parallel)
through safetensors slicing, never the full tensor; replicated parameters are
read whole. Every tensor's full shape is checked before anything is copied; an
error names the file and the tensor.
"""

import json
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm import tqdm

from engine.layers.linear import ColumnParallelLinear, RowParallelLinear

# checkpoint suffix -> (our module suffix, index of the part in the fused matrix)
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
    params = dict(model.named_parameters(remove_duplicate=False))
    modules = dict(model.named_modules(remove_duplicate=False))
    loaded: set[str] = set()
    files = checkpoint_files(model_dir)
    total = sum(len(safe_open(f, "pt").keys()) for f in files)
    with tqdm(total=total, desc="Loading weights", unit="tensor", disable=not show_progress) as bar:
        for path in files:
            with safe_open(path, framework="pt") as f:
                for name in f.keys():
                    _load_one(name, f, path, params, modules, loaded)
                    bar.update(1)
    _check_complete(params, modules, loaded, model.config, model_dir)


def checkpoint_target(name: str) -> tuple[str, int]:
    """Checkpoint tensor name -> (our parameter name, fused part index; 0 when not fused)."""
    ours = name.removeprefix("model.")
    for suffix, (fused, part) in _FUSED.items():
        marker = f".{suffix}."
        if marker in ours:
            return ours.replace(marker, f".{fused}."), part
    return ours, 0


def _load_one(name, f, path, params, modules, loaded) -> None:
    if name.endswith(_IGNORED_SUFFIXES):
        return
    ours, part = checkpoint_target(name)
    if ours not in params:
        raise WeightLoadError(f"{path.name}: tensor {name!r} has no place in the model (expected {ours!r})")
    module = modules[ours.rpartition(".")[0]]
    checkpoint = f.get_slice(name)
    dest, full_shape, read = _shard_of(module, params[ours], part)
    if tuple(checkpoint.get_shape()) != full_shape:
        raise WeightLoadError(
            f"{path.name}: tensor {name!r} has shape {tuple(checkpoint.get_shape())}, model expects {full_shape}"
        )
    dest.copy_(read(checkpoint))
    loaded.add(f"{ours}#{part}")


def _shard_of(module, param, part: int):
    """(where this rank's slice goes in `param`, the full checkpoint shape, how to read the slice)."""
    dest = param.data
    if isinstance(module, ColumnParallelLinear):
        rows = module.parts[part]
        dest = dest.narrow(0, module.offsets[part], rows.size)
        return dest, (module.part_sizes[part], *dest.shape[1:]), lambda t: t[rows.start : rows.stop]
    if isinstance(module, RowParallelLinear):
        cols = module.in_slice
        return dest, (dest.shape[0], module.in_features), lambda t: t[:, cols.start : cols.stop]
    return dest, tuple(dest.shape), lambda t: t[:]


def _num_parts(param_name: str, modules) -> int:
    module = modules[param_name.rpartition(".")[0]]
    return len(module.parts) if isinstance(module, ColumnParallelLinear) else 1


def _check_complete(params, modules, loaded, cfg, model_dir) -> None:
    missing = sorted(
        name
        for name in params
        if any(f"{name}#{p}" not in loaded for p in range(_num_parts(name, modules)))
        and not (cfg.tie_word_embeddings and name == "lm_head.weight")
    )
    if missing:
        raise WeightLoadError(f"{model_dir}: checkpoint lacks tensors for {missing[:8]}")
