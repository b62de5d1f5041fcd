"""Per-request sampling parameters, shaped like vLLM's `SamplingParams`.

The object is frozen and validated on construction, so every later stage
(sampler, scheduler, the text's owner in `output_text`) can trust its values without re-checking.
Validation failures are always `ValueError` naming the field, including
wrong types, because API layers turn `ValueError` into a 400 response.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

from wire.sampling_rules import check_sampling

# Below this temperature sampling is treated as greedy (argmax), as in vLLM.
_GREEDY_EPS = 1e-5
# engine.structured_output.KINDS (not imported: that module brings xgrammar in)
STRUCTURED_KINDS = ("json", "json_object", "regex", "choice", "grammar")


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens for one request and when to stop it.

    `top_k` of 0 or -1 disables top-k; `temperature` 0 means greedy;
    `logprobs` is the number of top alternatives returned besides the chosen
    token (0: only the chosen token's logprob, None: no logprobs).
    `stop` and `stop_token_ids` accept a single value or any iterable and
    are stored as tuples. `logit_bias` ({token id: bias in [-100, 100]}, added to
    the logits before sampling, as OpenAI's) is stored as sorted (id, bias) pairs.
    `structured` ((kind, spec), see engine.structured_output) constrains the output to a JSON schema,
    a regex, a choice of strings or a grammar.
    `stop`, `include_stop_str_in_output` and
    `skip_special_tokens` shape the text, which the engine core never makes:
    `LLM` applies them (`engine.offline_text`); workers never receive them.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None  # per prompt token: its logprob (the first's is None) and this many top
    logit_bias: tuple[tuple[int, float], ...] = ()
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    structured: tuple[str, str] | None = None  # (kind, spec): engine.structured_output
    # The prompt's last N tokens are output an earlier attempt produced (a migrated or recomputed request):
    # the grammar of `structured` continues after them.
    resumed_output_tokens: int = 0
    # Not sampling: the tenant's prefix-cache salt (wire.cache_salt), mixed into the hash of the prompt's
    # first block (engine.block_pool.chain_root). Kept here so it goes wherever the request's params go.
    cache_salt: str | None = None

    def __post_init__(self) -> None:
        self._normalise_stops()
        self._normalise_logit_bias()
        self._normalise_structured()
        self._validate_numbers()
        self._validate_flags()

    @property
    def is_greedy(self) -> bool:
        """True when the sampler takes the argmax instead of sampling."""
        return self.temperature < _GREEDY_EPS

    def stop_by(self, token: int, num_output: int, eos_token_ids) -> str | int | None:
        """Why `token`, the request's `num_output`-th output token, ends it: "eos", the stop token id itself,
        or None (it goes on; max_tokens is the caller's). Nothing stops it before min_tokens are out. The one
        rule the engine steps by and a decode worker's recompute applies to a first token made elsewhere."""
        if num_output < self.min_tokens:
            return None
        if not self.ignore_eos and token in eos_token_ids:
            return "eos"
        return token if token in self.stop_token_ids else None

    def _normalise_stops(self) -> None:
        stop = _as_tuple("stop", self.stop, str)
        for s in stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop strings must be non-empty strings, got {s!r}")
        ids = _as_tuple("stop_token_ids", self.stop_token_ids, Integral)
        for t in ids:
            if not _is_int(t) or t < 0:
                raise ValueError(f"stop_token_ids must be non-negative ints, got {t!r}")
        object.__setattr__(self, "stop", stop)
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in ids))

    def _normalise_logit_bias(self) -> None:
        bias = self.logit_bias
        pairs = bias.items() if isinstance(bias, dict) else bias
        if isinstance(pairs, (str, bytes)):
            raise ValueError(f"logit_bias must map token ids to numbers, got {bias!r}")
        normalised = {}
        for pair in pairs:
            if not isinstance(pair, (tuple, list)) or len(pair) != 2 or not _is_int(pair[0]) or pair[0] < 0:
                raise ValueError(f"logit_bias keys must be non-negative token ids, got {pair!r}")
            value = _as_float("logit_bias", pair[1])
            _check(-100.0 <= value <= 100.0, "logit_bias", value, "values must be in [-100, 100]")
            normalised[int(pair[0])] = value
        object.__setattr__(self, "logit_bias", tuple(sorted(normalised.items())))

    def _normalise_structured(self) -> None:
        value = self.structured
        if value is None:
            return
        if not isinstance(value, (tuple, list)) or len(value) != 2 or not all(isinstance(v, str) for v in value):
            raise ValueError(f"structured must be a (kind, spec) pair of strings, got {value!r}")
        if value[0] not in STRUCTURED_KINDS:
            raise ValueError(f"structured kind must be one of {', '.join(STRUCTURED_KINDS)}, got {value[0]!r}")
        object.__setattr__(self, "structured", (value[0], value[1]))

    def _validate_numbers(self) -> None:
        # Floats are stored as float so `temperature=1` and `1.0` compare equal.
        for name in ("temperature", "top_p", "min_p", "repetition_penalty",
                     "presence_penalty", "frequency_penalty"):
            object.__setattr__(self, name, _as_float(name, getattr(self, name)))
        for name in ("n", "top_k", "min_tokens", "resumed_output_tokens"):
            _require_int(name, getattr(self, name))
        for name in ("seed", "max_tokens", "logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                _require_int(name, getattr(self, name))

        check_sampling(self)  # the ranges, as the router and the wire check them (wire.sampling_rules)

    def _validate_flags(self) -> None:
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be a bool, got {value!r}")


def _check(ok: bool, name: str, value: Any, rule: str) -> None:
    if not ok:
        raise ValueError(f"{name} {rule}, got {value!r}")


def _is_int(value: Any) -> bool:
    # bool is an Integral subclass, but `n=True` is a caller bug, not 1.
    return isinstance(value, Integral) and not isinstance(value, bool)


def _require_int(name: str, value: Any) -> None:
    if not _is_int(value):
        raise ValueError(f"{name} must be an int, got {value!r}")


def _as_float(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return value


def _as_tuple(name: str, value: Any, scalar_type: type) -> tuple:
    """Accept one scalar, None, or any iterable of scalars."""
    if value is None:
        return ()
    if isinstance(value, scalar_type) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, (str, bytes)):
        raise ValueError(f"{name} must be a sequence, got {value!r}")
    try:
        return tuple(value)
    except TypeError:
        raise ValueError(f"{name} must be a sequence, got {value!r}") from None
