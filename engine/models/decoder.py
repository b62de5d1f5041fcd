"""A Llama-family decoder over a flattened ragged batch.

Covers Llama, Mistral, Qwen2 (bias on q/k/v) and Qwen3 (RMSNorm on q and k per
head, explicit head_dim). Q, K and V are one fused projection and gate/up
another, so a layer runs two large matmuls instead of five; the weight loader
fills the fused matrices from the separate Hugging Face tensors.
"""

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import AttentionMetadata
from engine.config import ModelConfig
from engine.layers.norm import RMSNorm
from engine.layers.rotary import RotaryEmbedding, apply_rotary



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

    def forward(self, rope, hidden, kv_cache, meta: AttentionMetadata, attn_fn):
        # hidden: [num_tokens, hidden_size]; rope: (cos, sin) of the step's positions
        qkv = self.qkv_proj(hidden).view(-1, self.num_heads + 2 * self.num_kv_heads, self.head_dim)
        qk, v = qkv.split([self.num_heads + self.num_kv_heads, self.num_kv_heads], dim=1)
        if self.q_norm is not None:
            q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
            qk = torch.cat((self.q_norm(q), self.k_norm(k)), dim=1)
        # Q and K heads share the positions: rotate them in one pass.
        qk = apply_rotary(qk, *rope)  # [num_tokens, heads + kv_heads, dim]
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
        out = attn_fn(q, k, v, kv_cache[0], kv_cache[1], meta, self.scale)
        return self.o_proj(out.flatten(1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.intermediate_size = cfg.intermediate_size
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, rope, hidden, kv_cache, meta, attn_fn):
        hidden = hidden + self.self_attn(rope, self.input_layernorm(hidden), kv_cache, meta, attn_fn)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class DecoderForCausalLM(nn.Module):
    """forward() returns hidden states; compute_logits() projects only the rows that sample."""

    def __init__(self, cfg: ModelConfig, max_positions: int):
        super().__init__()
        self.config = cfg
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
        hidden = self.embed_tokens(input_ids)  # [num_tokens, hidden_size]
        rope = self.rotary.lookup(positions, hidden.dtype)
        for layer, kv_cache in zip(self.layers, kv_caches):
            hidden = layer(rope, hidden, kv_cache, meta, attn_fn)
        return self.norm(hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)  # [num_rows, vocab_size]
