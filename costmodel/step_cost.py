"""The price of one forward step, in seconds, from its shape: a handful of terms that each say what they are.

    seconds = fixed_s
            + max(weights_s, per_token_s * tokens        the linear layers: reading every weight once bounds a
                  + per_small_step_token_s                small batch (memory), compute per token a large one,
                    * min(tokens, SMALL_STEP_TOKENS))     dearer for a step's first tokens (a matrix product of
                                                          few rows uses the cores less well)
            + per_token_comm_s * tokens                   tensor parallel: the all-reduces' bytes per token
            + per_sampled_row_s * sampled_rows            the vocabulary projection and sampling of a row
            + per_sequence_s * sequences                  host work per sequence (inputs, bookkeeping)
            + per_decode_context_token_s * decode_context_tokens     decode attention: KV read
            + per_longest_decode_context_s * longest_decode_context  decode attention: the longest row, which
                                                                      one thread reads alone on a CPU
            + per_attention_pair_s * prefill_attention_pairs         prefill attention: (query, key) pairs
            + per_prefix_attention_pair_s * prefix_attention_pairs   ... more for a chunk after a cached prefix
                                                                      (keys read from the cache, under a mask)
            + per_prefill_context_token_s * prefill_context_tokens   prefill attention: KV read (a short
                                                                      chunk after a long cached context)

The same form is fitted from measured steps (`planner.profiler`) and derived from a device's published
figures (`costmodel.devices`). It is a leaf: no torch, nothing of Tandem's, so the router can price a
step per request.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from costmodel.step_shape import StepShape

# Tokens of a step below which each costs the linear layers `per_small_step_token_s` more. Refitting the 374
# steps of a profile of 2026-11-28 (2 cores of a Xeon, float32) with any value from 128 to 1024 gave fits
# within 1% of each other; without the term, 64-token prompts were priced 8-12% under and 2048-token ones
# 9-11% over, with it 3-8% under and 2-4% over.
SMALL_STEP_TOKENS = 256


@dataclass(frozen=True)
class StepCost:
    fixed_s: float = 0.0
    weights_s: float = 0.0
    per_token_s: float = 0.0
    per_token_comm_s: float = 0.0
    per_sampled_row_s: float = 0.0
    per_sequence_s: float = 0.0
    per_decode_context_token_s: float = 0.0
    per_longest_decode_context_s: float = 0.0
    per_attention_pair_s: float = 0.0
    per_prefill_context_token_s: float = 0.0
    per_prefix_attention_pair_s: float = 0.0
    per_small_step_token_s: float = 0.0

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if not value >= 0:  # also refuses NaN
                raise ValueError(f"step cost term {f.name} must be >= 0 seconds, got {value}")

    def seconds(self, shape: StepShape) -> float:
        """The predicted duration of a step of this shape; 0 for an empty step."""
        if shape.sequences == 0:
            return 0.0
        return sum(self.terms(shape).values())

    def terms(self, shape: StepShape) -> dict[str, float]:
        """Each term's seconds for this shape (the linear layers as one: memory or compute, whichever binds)."""
        return {
            "fixed": self.fixed_s,
            "linear": max(self.weights_s, self.per_token_s * shape.tokens
                          + self.per_small_step_token_s * min(shape.tokens, SMALL_STEP_TOKENS)),
            "tp_comm": self.per_token_comm_s * shape.tokens,
            "sampled_rows": self.per_sampled_row_s * shape.sampled_rows,
            "sequences": self.per_sequence_s * shape.sequences,
            "decode_attention": self.per_decode_context_token_s * shape.decode_context_tokens
            + self.per_longest_decode_context_s * shape.longest_decode_context,
            "prefill_attention": self.per_attention_pair_s * shape.prefill_attention_pairs
            + self.per_prefix_attention_pair_s * shape.prefix_attention_pairs
            + self.per_prefill_context_token_s * shape.prefill_context_tokens,
        }

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "StepCost":
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown step cost term(s): {', '.join(sorted(unknown))}")
        return cls(**{k: float(v) for k, v in data.items()})
