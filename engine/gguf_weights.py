"""A GGUF model's linear weights served in the file's own blocks (`engine.quantized_weight`).

    attached = attach_gguf_blocks(model, model_dir, cfg)  # after load_weights; {qtype: count of weights}

A .gguf model is converted once into a safetensors folder (`engine.gguf_convert`) whose done-marker names the
file; the engine loads that folder as any checkpoint, and then, where the file still holds a weight in a type
the native kernels multiply (Q8_0, Q4_0, Q4_1), each linear takes those blocks instead of its widened copy: a
decode step then reads the file's bytes (4.5 bits a weight for Q4_1) instead of 16 or 32 bits a weight.

Nothing about the two orders is assumed: llama.cpp's converter reorders the rows of q and k of llama-family
models (it puts the two halves of each head's rotary pairs side by side) and transformers puts them back on
conversion. Each part of each linear is checked against the tensor the converted checkpoint holds, as the file
has it and with that reordering undone; the blocks widened (`dequantize`) equal the converted tensor bit for
bit in one of the two, or the linear stays dense and the log says which weight and why.

Who owns what: the blocks become `PreparedLinear.quantized` (the dense parameter goes at `prepare`, as a packed
weight's does), and `DecoderForCausalLM.lm_head_quantized` for a tied embedding in blocks (the embedding
itself stays dense: a lookup reads a few rows of it, not all).
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import torch

from engine.gguf_convert import DONE_MARKER, source_identity
from engine.layers.linear import ColumnParallelLinear, PreparedLinear, RowParallelLinear
from engine.quantized_weight import QTYPES, QuantizedWeight, dequantize
from engine.weight_loader import checkpoint_target

logger = logging.getLogger("tandem.engine")

# GGUF's names of a layer's linears -> the checkpoint's (llama-family: llama, mistral, qwen2, ...)
_LAYER_LINEARS = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                  "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                  "ffn_down": "mlp.down_proj"}  # fmt: skip
_OTHERS = {"token_embd.weight": "model.embed_tokens.weight", "output.weight": "lm_head.weight"}


def gguf_source(model_dir: str | Path) -> Path | None:
    """The .gguf file `model_dir` was converted from, while it is still the file converted; else None."""
    try:
        marker = json.loads((Path(model_dir) / DONE_MARKER).read_text())
        source = Path(marker["source"])
        return source if source.is_file() and source_identity(source) == marker else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def checkpoint_name(gguf_name: str) -> str | None:
    """The converted checkpoint's name of a GGUF tensor (None: not a weight served in blocks here)."""
    if gguf_name in _OTHERS:
        return _OTHERS[gguf_name]
    found = re.fullmatch(r"blk\.(\d+)\.(\w+)\.weight", gguf_name)
    if found is None or found.group(2) not in _LAYER_LINEARS:
        return None
    return f"model.layers.{found.group(1)}.{_LAYER_LINEARS[found.group(2)]}.weight"


def read_blocks(gguf: str | Path) -> dict[str, QuantizedWeight]:
    """Every weight of `gguf` in a type served in blocks, by its checkpoint name, rows as the file has them."""
    from gguf import GGUFReader

    blocks = {}
    for tensor in GGUFReader(str(gguf)).tensors:
        name = checkpoint_name(tensor.name)
        if name is not None and tensor.tensor_type.name in QTYPES:
            blocks[name] = QuantizedWeight.from_gguf_rows(tensor.tensor_type.name, tensor.data)
    return blocks


def attach_gguf_blocks(model: torch.nn.Module, model_dir: str | Path) -> dict[str, int]:
    """Give each linear of `model` (loaded from `model_dir`) its blocks from the GGUF file it was converted
    from, where they equal what was loaded (module doc). Returns how many weights took blocks, by type."""
    source = gguf_source(model_dir)
    if source is None:
        return {}
    blocks = read_blocks(source)
    parts_of: dict[str, dict[int, QuantizedWeight]] = {}
    for name, weight in blocks.items():
        ours, part = checkpoint_target(name)
        parts_of.setdefault(ours.removesuffix(".weight"), {})[part] = weight
    attached: dict[str, int] = {}
    cfg = model.config
    for module_name, module in model.named_modules():
        if isinstance(module, PreparedLinear) and module_name in parts_of:
            shard = _shard(module, parts_of[module_name], cfg, module_name)
            if shard is not None:
                module.quantized = shard
                attached[shard.qtype] = attached.get(shard.qtype, 0) + 1
    head = blocks.get("lm_head.weight")
    if head is None and cfg.tie_word_embeddings:
        head = blocks.get("model.embed_tokens.weight")
    if head is not None and _matches(head, model.lm_head.weight.data, "lm_head"):
        model.lm_head_quantized = head
        attached[head.qtype] = attached.get(head.qtype, 0) + 1
    return attached


def _shard(module: PreparedLinear, parts: dict[int, QuantizedWeight], cfg, name: str) -> QuantizedWeight | None:
    """This rank's blocks of `module`, each part in the loaded tensor's row order; None: it stays dense."""
    dense = module.weight.data
    if isinstance(module, RowParallelLinear):
        full = parts.get(0)
        if full is None or module.in_slice.start % 32 or module.in_slice.stop % 32:
            return None  # a shard that cuts a block of 32 stays dense
        shard = full.columns(module.in_slice.start, module.in_slice.stop)
        return shard if _matches(shard, dense, name) else None
    assert isinstance(module, ColumnParallelLinear)
    if sorted(parts) != list(range(len(module.parts))) or len({p.qtype for p in parts.values()}) != 1:
        return None  # a part missing from the file's blocks, or parts of two types: dense
    shards = []
    for i, rows in enumerate(module.parts):
        loaded = dense.narrow(0, module.offsets[i], rows.size)
        heads = _rotary_heads(cfg, name, i)
        shard = _in_loaded_order(parts[i], rows.start, rows.stop, loaded, heads)
        if shard is None:
            logger.warning("%s part %d: the GGUF blocks equal the loaded weight in no row order; it stays dense",
                           name, i)  # fmt: skip
            return None
        shards.append(shard)
    return QuantizedWeight.cat(shards)


def _rotary_heads(cfg, name: str, part: int) -> int | None:
    """The head count whose rotary halves llama.cpp interleaved in this part's rows (q, k), else None."""
    if name.endswith("self_attn.qkv_proj") and part in (0, 1):
        return cfg.num_heads if part == 0 else cfg.num_kv_heads
    return None


def _in_loaded_order(full: QuantizedWeight, start: int, stop: int, loaded: torch.Tensor,
                     heads: int | None) -> QuantizedWeight | None:  # fmt: skip
    """Rows [start, stop) of `full` in the loaded tensor's order: as the file has them, or with llama.cpp's
    rotary reordering undone; None when neither equals `loaded`."""
    orders = [None] if heads is None else [None, rotary_halves_order(full.out_features, heads)]
    for order in orders:
        rows = full if order is None else full.permuted_rows(order)
        shard = rows.rows(start, stop)
        if _widens_to(shard, loaded):
            return shard
    return None


def rotary_halves_order(rows: int, heads: int) -> torch.Tensor:
    """For each row of the checkpoint's q (or k), the row of the GGUF tensor that holds it: llama.cpp stores
    each head's rows as pairs (i, i + half) side by side, where the checkpoint has the two halves apart."""
    half = rows // heads // 2
    checkpoint_row_at = torch.arange(rows).reshape(heads, 2, half).transpose(1, 2).reshape(-1)  # file row -> ckpt
    return torch.argsort(checkpoint_row_at)


def _widens_to(weight: QuantizedWeight, loaded: torch.Tensor) -> bool:
    """Whether `weight`'s blocks widened are `loaded` bit for bit (in its dtype)."""
    return tuple(loaded.shape) == weight.shape and torch.equal(dequantize(weight).to(loaded.dtype), loaded)


def _matches(weight: QuantizedWeight, loaded: torch.Tensor, name: str) -> bool:
    if _widens_to(weight, loaded):
        return True
    logger.warning("%s: the GGUF blocks do not equal the loaded weight; it stays dense", name)
    return False
