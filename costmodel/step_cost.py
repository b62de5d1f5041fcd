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
            + kernel_band_s(tokens)                       the linear layers' kernel for the step's token count:
                                                          a CPU engine times its candidates per band of row
                                                          counts and keeps the fastest per band
                                                          (`engine.layers.linear_choice.BANDS`), so the linear
                                                          layers' time steps where the kernel changes

The kernel bands are a table, (the band's first token count, the seconds it adds) each, the cheapest band
at 0: on 2 cores of an AMD EPYC (bfloat16, 2026-11-28) the default model's linears ran on its GGUF blocks for
1-4 rows and on oneDNN's bfloat16 GEMM (three times the bytes) from 5, and a smooth line through the profile's
steps priced 4-row decode steps 7% over their time, 8-row ones 10% under, and served 5-row steps at 1.4x.

The same form is fitted from measured steps (`planner.profiler`) and derived from a device's published
figures (`costmodel.devices`). It is a leaf: no torch, nothing of Tandem's, so the router can price a
step per request.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import asdict, dataclass, fields
from typing import Callable, Sequence

from costmodel.step_shape import StepShape

# Tokens of a step below which each costs the linear layers `per_small_step_token_s` more. Refitting the 374
# steps of a profile of 2026-11-28 (2 cores of a Xeon, float32) with any value from 128 to 1024 gave fits
# within 1% of each other; without the term, 64-token prompts were priced 8-12% under and 2048-token ones
# 9-11% over, with it 3-8% under and 2-4% over.
SMALL_STEP_TOKENS = 256


def band_index(firsts: Sequence[int], tokens: int) -> int:
    """The index of the band a step of `tokens` tokens falls in, of bands starting at `firsts` (ascending): the
    last starting at or below it; -1 below the first."""
    return bisect_right(firsts, tokens) - 1


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
    kernel_bands: tuple[tuple[int, float], ...] = ()  # (first token count of a band, seconds it adds), ascending

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name != "kernel_bands" and not value >= 0:  # also refuses NaN
                raise ValueError(f"step cost term {f.name} must be >= 0 seconds, got {value}")
        firsts = [first for first, _ in self.kernel_bands]
        if firsts != sorted(set(firsts)) or any(first < 1 for first in firsts):
            raise ValueError(f"kernel bands must start at ascending token counts >= 1, got {firsts}")
        if any(not seconds >= 0 for _, seconds in self.kernel_bands):
            raise ValueError(f"a kernel band's seconds must be >= 0, got {list(self.kernel_bands)}")

    def kernel_band_s(self, tokens: int) -> float:
        """The seconds the kernel band of a step of `tokens` tokens adds: the last band starting at or below it
        (0 below the first band, or with no bands: a published profile's one kernel)."""
        i = band_index([first for first, _ in self.kernel_bands], tokens)
        return self.kernel_bands[i][1] if i >= 0 else 0.0

    def describe_kernel_bands(self) -> str:
        """The bands as a line of text ("" with none)."""
        return ", ".join(f"from {first} tokens {seconds * 1e3:.3g} ms" for first, seconds in self.kernel_bands)

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
            "kernel_band": self.kernel_band_s(shape.tokens),
            "tp_comm": self.per_token_comm_s * shape.tokens,
            "sampled_rows": self.per_sampled_row_s * shape.sampled_rows,
            "sequences": self.per_sequence_s * shape.sequences,
            "decode_attention": self.per_decode_context_token_s * shape.decode_context_tokens
            + self.per_longest_decode_context_s * shape.longest_decode_context,
            "prefill_attention": self.per_attention_pair_s * shape.prefill_attention_pairs
            + self.per_prefix_attention_pair_s * shape.prefix_attention_pairs
            + self.per_prefill_context_token_s * shape.prefill_context_tokens,
        }

    def scaled(self, by: Callable[[str], float]) -> "StepCost":
        """Every term times `by(its name)` (the kernel bands' seconds by "kernel_bands")."""
        terms = {f.name: getattr(self, f.name) * by(f.name) for f in fields(self) if f.name != "kernel_bands"}
        bands = tuple((first, seconds * by("kernel_bands")) for first, seconds in self.kernel_bands)
        return StepCost(**terms, kernel_bands=bands)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "StepCost":
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown step cost term(s): {', '.join(sorted(unknown))}")
        bands = tuple((int(first), float(seconds)) for first, seconds in data.get("kernel_bands", ()))
        return cls(**{k: float(v) for k, v in data.items() if k != "kernel_bands"}, kernel_bands=bands)
