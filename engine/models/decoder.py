"""A Llama-family decoder over a flattened ragged batch.

Covers Llama, Mistral, Qwen2 (bias on q/k/v) and Qwen3 (RMSNorm on q and k per
head, explicit head_dim). Q, K and V are one fused projection and gate/up
another, so a layer runs two large matmuls instead of five; the weight loader
fills the fused matrices from the separate Hugging Face tensors.
"""

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from engine.attention import AttentionMetadata
from engine.config import ModelConfig
from engine.layers.norm import RMSNorm
from engine.layers.ops import TORCH_OPS, LayerOps
from engine.layers.rotary import RotaryEmbedding


@dataclass(frozen=True)
class StepContext:
    """What every layer of one forward shares."""

    cos: torch.Tensor  # [num_tokens, head_dim]
    signed_sin: torch.Tensor  # [num_tokens, head_dim]
    meta: AttentionMetadata
    attn_fn: Callable
    ops: LayerOps


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.scale = self.head_dim**-0.5

    def forward(self, ctx: StepContext, hidden, kv_cache):
        # hidden: [num_tokens, hidden_size]
        ops, qk_heads = ctx.ops, self.num_heads + self.num_kv_heads
        qkv = ops.linear(hidden, self.qkv_proj.weight, self.qkv_proj.bias)
        qkv = qkv.view(-1, qk_heads + self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = qkv[:, : self.num_heads], qkv[:, self.num_heads : qk_heads]
            qkv = torch.cat((self.q_norm(q), self.k_norm(k), qkv[:, qk_heads:]), dim=1)
        # Q and K heads share the positions: rotate them in one pass.
        qk = ops.rotary(qkv, qk_heads, ctx.cos, ctx.signed_sin)  # [num_tokens, heads + kv_heads, dim]
        q, k, v = qk[:, : self.num_heads], qk[:, self.num_heads :], qkv[:, qk_heads:]
        out = ctx.attn_fn(q, k, v, kv_cache[0], kv_cache[1], ctx.meta, self.scale)
        return ops.linear(out.flatten(1), self.o_proj.weight)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, ops: LayerOps, x):
        gate_up = ops.linear(x, self.gate_up_proj.weight)  # [num_tokens, 2 * intermediate]
        return ops.linear(ops.silu_and_mul(gate_up), self.down_proj.weight)


class DecoderLayer(nn.Module):
    """Carries the residual stream beside the hidden state, so each residual add
    fuses with the norm that follows it (same sums as Hugging Face's layer)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
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
    device and dtype; the PyTorch ops are the default.
    """

    def __init__(self, cfg: ModelConfig, max_positions: int):
        super().__init__()
        self.config = cfg
        self.ops = TORCH_OPS
        self.rotary = RotaryEmbedding(cfg.head_dim, max_positions, cfg.rope_theta, cfg.rope_scaling)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share lm_head with the embedding when the config says so (again after to_empty())."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, input_ids, positions, kv_caches, meta: AttentionMetadata, attn_fn) -> torch.Tensor:
        # input_ids, positions: [num_tokens]; kv_caches: one (key_cache, value_cache) per layer
        residual = self.embed_tokens(input_ids)  # [num_tokens, hidden_size]
        hidden = torch.zeros_like(residual)  # nothing to add before the first norm
        ctx = StepContext(*self.rotary.lookup(positions, residual.dtype), meta, attn_fn, self.ops)
        for layer, kv_cache in zip(self.layers, kv_caches):
            hidden, residual = layer(ctx, hidden, residual, kv_cache)
        hidden, _ = self.ops.add_rms_norm(hidden, residual, self.norm.weight, self.norm.eps)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.ops.linear(hidden, self.lm_head.weight)  # [num_rows, vocab_size]
