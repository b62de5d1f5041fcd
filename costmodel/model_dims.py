"""A decoder model's sizes, as far as cost goes: what a step reads and computes, and what a token's KV weighs.

Built from a Hugging Face `config.json` dict (`from_hf_config`), so the leaf needs no engine to read it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ModelDims:
    name: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 2048

    @classmethod
    def from_hf_config(cls, cfg: dict, name: str = "") -> "ModelDims":
        heads = cfg["num_attention_heads"]
        return cls(
            name=name or cfg.get("_name_or_path", "") or "model",
            num_layers=cfg["num_hidden_layers"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            vocab_size=cfg["vocab_size"],
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
        )

    @property
    def layer_params(self) -> int:
        """Weights of one decoder layer's linears: q, k, v, o and the gated MLP (norms are negligible)."""
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return h * q + 2 * h * kv + q * h + 3 * h * self.intermediate_size

    @property
    def linear_params(self) -> int:
        """Weights every token goes through (all layers, not the vocabulary projection)."""
        return self.num_layers * self.layer_params

    @property
    def lm_head_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def weight_params(self) -> int:
        """Every weight a server holds: layers, vocabulary projection and (untied) embedding."""
        embedding = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        return self.linear_params + self.lm_head_params + embedding

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V of one token over every layer."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    def attention_flops_per_pair(self) -> int:
        """Q.K and P.V of one (query, key) pair over every layer and head."""
        return 4 * self.num_layers * self.num_heads * self.head_dim

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ModelDims":
        return cls(**data)
