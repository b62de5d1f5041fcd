"""Hand-made profiles for planner tests: a tiny model's dims and step prices simple enough to reckon by hand."""

from __future__ import annotations

from costmodel import ModelDims, Profile, ServingCost, StepCost, TransferCost

TINY_DIMS = ModelDims("tiny", num_layers=2, hidden_size=8, intermediate_size=16, num_heads=2, num_kv_heads=1,
                      head_dim=4, vocab_size=1000, max_position_embeddings=4096)  # fmt: skip  (32 B of KV per token)


def hand_profile(fixed_s: float = 0.010, per_token_s: float = 0.001, message_s: float = 0.0,
                 transfer: TransferCost = TransferCost(), kv_cache_tokens: int = 16 * 64, **terms) -> Profile:  # fmt: skip
    """Steps cost `fixed_s + per_token_s * tokens` (plus any `terms`); serving adds only `message_s` per hop."""
    return Profile(device="hand", source="published", model=TINY_DIMS, dtype="bfloat16", tp_size=1,
                   step=StepCost(fixed_s=fixed_s, per_token_s=per_token_s, **terms), transfer=transfer,
                   kv_cache_tokens=kv_cache_tokens,
                   serving=ServingCost(request_s=0.0, message_s=message_s, per_round_s=0.0, per_delta_s=0.0))  # fmt: skip
