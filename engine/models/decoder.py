"""A Llama-family decoder over a flattened ragged batch.

Covers Llama, Mistral, Qwen2 (bias on q/k/v) and Qwen3 (RMSNorm on q and k per
head, explicit head_dim). Q, K and V are one fused projection and gate/up
another, so a layer runs two large matmuls instead of five; the weight loader
fills the fused matrices from the separate Hugging Face tensors.

Under tensor parallelism (`tp`, see engine/parallel) each rank builds the same
model with its share of heads and intermediate features: QKV and gate/up are
column-parallel, o_proj and down_proj row-parallel (all-reduced); the norms,
the embedding and lm_head are replicated.
"""

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from engine.attention import AttentionMetadata
from engine.config import ModelConfig
from engine.layers.linear import ColumnParallelLinear, PreparedLinear, RowParallelLinear
from engine.layers.norm import RMSNorm
from engine.layers.elementwise_choice import OpShapes
from engine.layers.ops import TORCH_OPS, LayerOps
from engine.layers.rotary import RotaryEmbedding
from engine.parallel.group import SINGLE, TPGroup
from engine.parallel.shard import even_slice, gate_up_slices, kv_head_slice, qkv_slices


@dataclass(frozen=True)
class StepContext:
    """What every layer of one forward shares."""

    cos: torch.Tensor  # [num_tokens, head_dim]
    signed_sin: torch.Tensor  # [num_tokens, head_dim]
    meta: AttentionMetadata
    attn_fn: Callable
    ops: LayerOps


def _all_reduce(tp: TPGroup):
    return tp.all_reduce if tp.size > 1 else None


class Attention(nn.Module):
    """This rank's heads: num_heads / tp query heads and their KV heads (see engine/parallel/shard.py)."""

    def __init__(self, cfg: ModelConfig, tp: TPGroup):
        super().__init__()
        self.head_dim = hd = cfg.head_dim
        q_heads = even_slice(cfg.num_heads, tp.size, tp.rank)
        self.num_heads, self.num_kv_heads = q_heads.size, kv_head_slice(cfg.num_kv_heads, tp.size, tp.rank).size
        q_size, kv_size = cfg.num_heads * hd, cfg.num_kv_heads * hd
        slices = qkv_slices(cfg.num_heads, cfg.num_kv_heads, hd, tp.size, tp.rank)
        self.qkv_proj = ColumnParallelLinear(cfg.hidden_size, (q_size, kv_size, kv_size), slices, cfg.qkv_bias)
        self.o_proj = RowParallelLinear(q_size, q_heads.scaled(hd), cfg.hidden_size, _all_reduce(tp))
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.scale = self.head_dim**-0.5

    def forward(self, ctx: StepContext, hidden, kv_cache):
        # hidden: [num_tokens, hidden_size]
        ops, qk_heads = ctx.ops, self.num_heads + self.num_kv_heads
        qkv = self.qkv_proj.project(ops, hidden)
        qkv = qkv.view(-1, qk_heads + self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = qkv[:, : self.num_heads], qkv[:, self.num_heads : qk_heads]
            qkv = torch.cat((self.q_norm(q), self.k_norm(k), qkv[:, qk_heads:]), dim=1)
        # Q and K heads share the positions: rotate them in one pass.
        qk = ops.rotary(qkv, qk_heads, ctx.cos, ctx.signed_sin)  # [num_tokens, heads + kv_heads, dim]
        q, k, v = qk[:, : self.num_heads], qk[:, self.num_heads :], qkv[:, qk_heads:]
        out = ctx.attn_fn(q, k, v, kv_cache[0], kv_cache[1], ctx.meta, self.scale)
        return self.o_proj.project(ops, out.flatten(1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TPGroup):
        super().__init__()
        inter = cfg.intermediate_size
        slices = gate_up_slices(inter, tp.size, tp.rank)
        self.gate_up_proj = ColumnParallelLinear(cfg.hidden_size, (inter, inter), slices, bias=False)
        self.down_proj = RowParallelLinear(inter, slices[0], cfg.hidden_size, _all_reduce(tp))

    def forward(self, ops: LayerOps, x):
        gate_up = self.gate_up_proj.project(ops, x)  # [num_tokens, 2 * intermediate / tp]
        return self.down_proj.project(ops, ops.silu_and_mul(gate_up))


class DecoderLayer(nn.Module):
    """Carries the residual stream beside the hidden state, so each residual add
    fuses with the norm that follows it (same sums as Hugging Face's layer)."""

    def __init__(self, cfg: ModelConfig, tp: TPGroup):
        super().__init__()
        self.self_attn = Attention(cfg, tp)
        self.mlp = MLP(cfg, tp)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, ctx: StepContext, hidden, residual, kv_cache):
        # residual: sum of everything before this layer; hidden: the last block's output not yet added
        ops, norm, post_norm = ctx.ops, self.input_layernorm, self.post_attention_layernorm
        x, residual = ops.add_rms_norm(hidden, residual, norm.weight, norm.eps)
        hidden = self.self_attn(ctx, x, kv_cache)
        x, residual = ops.add_rms_norm(hidden, residual, post_norm.weight, post_norm.eps)
        return self.mlp(ops, x), residual


class DecoderForCausalLM(nn.Module):
    """forward() returns hidden states; compute_logits() projects only the rows that sample.

    `ops` (the elementwise ops and linear) is chosen by the loader for the
    device and dtype; the PyTorch ops are the default. `tp` says which shard of
    the layers this process holds (all of them by default).
    """

    def __init__(self, cfg: ModelConfig, max_positions: int, tp: TPGroup = SINGLE):
        super().__init__()
        self.config = cfg
        self.ops = TORCH_OPS
        self.rotary = RotaryEmbedding(cfg.head_dim, max_positions, cfg.rope_theta, cfg.rope_scaling)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, tp) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.lm_head_weight = None  # lm_head's weight as `ops.linear` takes it, set by prepare()
        self.lm_head_quantized = None  # lm_head in the GGUF file's blocks (engine.gguf_weights), when it is
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share lm_head with the embedding when the config says so (again after to_empty())."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def linear_shapes(self) -> list[tuple[int, int]]:
        """The [out, in] shape of every dense linear weight the layers hold (the kernels are chosen on these)."""
        return sorted({tuple(m.weight.shape) for m in self.modules()
                       if isinstance(m, PreparedLinear) and m.quantized is None})  # fmt: skip

    def quantized_shapes(self) -> dict[str, list[tuple[int, int]]]:
        """The [out, in] shapes of the weights in GGUF blocks (lm_head's too), by quantized type."""
        weights = [m.quantized for m in self.modules() if isinstance(m, PreparedLinear) and m.quantized is not None]
        shapes: dict[str, set] = {}
        for weight in [*weights, *([self.lm_head_quantized] if self.lm_head_quantized is not None else [])]:
            shapes.setdefault(weight.qtype, set()).add(weight.shape)
        return {qtype: sorted(found) for qtype, found in shapes.items()}

    def op_shapes(self) -> OpShapes:
        """What this rank's elementwise ops work on (their implementations are chosen on these)."""
        attention, mlp = self.layers[0].self_attn, self.layers[0].mlp
        heads = attention.num_heads + attention.num_kv_heads
        return OpShapes(self.config.hidden_size, mlp.down_proj.weight.shape[1], heads, attention.head_dim)

    def prepare(self, ops: LayerOps) -> None:
        """After loading: use `ops` and put every linear weight in the form its `linear` takes.

        lm_head keeps its dense weight too: it is the embedding when tied."""
        self.ops = ops
        for module in self.modules():
            if isinstance(module, PreparedLinear):
                module.prepare(ops)
        quantized, loaded = self.lm_head_quantized, self.lm_head.weight.data
        if quantized is None:
            self.lm_head_weight = ops.prepare_weight(loaded)
        else:
            self.lm_head_weight = ops.prepare_quantized(quantized, loaded)

    def forward(self, input_ids, positions, kv_caches, meta: AttentionMetadata, attn_fn,
                layer_done: Callable[[int], None] | None = None) -> torch.Tensor:  # fmt: skip
        # input_ids, positions: [num_tokens]; kv_caches: one (key_cache, value_cache) per layer
        residual = self.embed_tokens(input_ids)  # [num_tokens, hidden_size]
        hidden = torch.zeros_like(residual)  # nothing to add before the first norm
        ctx = StepContext(*self.rotary.lookup(positions, residual.dtype), meta, attn_fn, self.ops)
        for i, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches)):
            hidden, residual = layer(ctx, hidden, residual, kv_cache)
            if layer_done is not None:
                layer_done(i)  # layer i's KV of this step is in the cache (engine.kv_connector)
        hidden, _ = self.ops.add_rms_norm(hidden, residual, self.norm.weight, self.norm.eps)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.ops.linear(hidden, self.lm_head_weight)  # [num_rows, vocab_size]
