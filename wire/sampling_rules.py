"""The ranges of the sampling parameters, written once.

The router answers a value out of range with a 400 naming it (`router.openai_common.sampling_from`), the
wire's `SamplingSpec` checks itself on construction (a worker decodes none out of range), and the engine's
`SamplingParams` checks the same rules after it has coerced the types. Each rule reads the field by its
name, so any sampling object with those names can be checked; a field it lacks is not checked.
"""

from __future__ import annotations

from wire.cache_salt import MAX_CACHE_SALT_CHARS, valid_cache_salt

MAX_LOGPROBS = 20  # alternatives per token, as vLLM's and OpenAI's bound
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what torch.Generator.manual_seed accepts

RULES = (
    ("n", lambda v: v >= 1, "must be >= 1"),
    ("temperature", lambda v: v >= 0.0, "must be >= 0"),
    ("top_p", lambda v: 0.0 < v <= 1.0, "must be in (0, 1]"),
    ("top_k", lambda v: v == -1 or v >= 0, "must be -1 or 0 (disabled) or a positive int"),
    ("min_p", lambda v: 0.0 <= v <= 1.0, "must be in [0, 1]"),
    ("repetition_penalty", lambda v: v > 0.0, "must be > 0"),
    ("presence_penalty", lambda v: -2.0 <= v <= 2.0, "must be in [-2, 2]"),
    ("frequency_penalty", lambda v: -2.0 <= v <= 2.0, "must be in [-2, 2]"),
    ("max_tokens", lambda v: v is None or v >= 1, "must be >= 1 or None"),
    ("min_tokens", lambda v: v >= 0, "must be >= 0"),
    ("resumed_output_tokens", lambda v: v >= 0, "must be >= 0"),
    ("logprobs", lambda v: v is None or 0 <= v <= MAX_LOGPROBS, f"must be in [0, {MAX_LOGPROBS}] or None"),
    ("prompt_logprobs", lambda v: v is None or 0 <= v <= MAX_LOGPROBS, f"must be in [0, {MAX_LOGPROBS}] or None"),
    ("seed", lambda v: v is None or SEED_MIN <= v <= SEED_MAX, "must fit in 64 bits"),
    # Not sampling, but it travels with it to every engine that hashes the prompt's blocks (wire.cache_salt).
    ("cache_salt", valid_cache_salt, f"must be a string of at most {MAX_CACHE_SALT_CHARS} characters or None"),
)


class SamplingOutOfRange(ValueError):
    """A sampling parameter outside its range; `param` names it (an OpenAI error's param)."""

    def __init__(self, param: str, rule: str, value: object):
        super().__init__(f"{param} {rule}, got {value!r}")
        self.param = param


def check_sampling(sampling) -> None:
    """Raise `SamplingOutOfRange` for the first field of `sampling` outside its range."""
    for name, within, rule in RULES:
        if hasattr(sampling, name) and not within(getattr(sampling, name)):
            raise SamplingOutOfRange(name, rule, getattr(sampling, name))
    max_tokens, min_tokens = getattr(sampling, "max_tokens", None), getattr(sampling, "min_tokens", 0)
    if max_tokens is not None and min_tokens > max_tokens:
        raise SamplingOutOfRange("min_tokens", f"must be <= max_tokens ({max_tokens})", min_tokens)
