"""Bounds on the work one request may ask for, checked before any of that work starts (tokenizing,
dispatching, matching stop strings after every token). A request past one is a 400 naming the field.

Without them, values an ordinary JSON body carries cost far more than the body: 100,000 stop strings
cost the router's text stream 131 ms of its event loop per generated token (and a worker that matched
them would be taken for dead), thousands of prompts in one request would each be tokenized and
dispatched before admission could refuse them. The defaults are vLLM's where vLLM has one (4 stop
strings, as OpenAI; 128 stop token ids; 1,024 prompts per request).
"""

from __future__ import annotations

from dataclasses import dataclass

from router.api_models import _GenerationFields
from router.errors import bad_request


@dataclass(frozen=True)
class RequestLimits:
    max_stop_strings: int = 4
    max_stop_string_chars: int = 1024  # each
    max_stop_token_ids: int = 128
    max_prompts: int = 1024  # prompts in one completions request (checked first: the cheaper answer)
    # prompts x n: sequences one request runs. More than the router admits at once (max_in_flight, 256 by
    # default) could only ever be a 429, so this bound is the tighter one unless both are raised.
    max_sequences: int = 256
    max_logit_bias: int = 1024  # entries


def check_limits(body: _GenerationFields, limits: RequestLimits, num_prompts: int = 1) -> None:
    """400 for the first field past its bound; cheap (counts and lengths only)."""
    stop = [body.stop] if isinstance(body.stop, str) else body.stop or []
    _at_most(len(stop), limits.max_stop_strings, "stop", "stop strings")
    if any(len(s) > limits.max_stop_string_chars for s in stop):
        raise bad_request(f"stop strings must be at most {limits.max_stop_string_chars} characters", "stop")
    _at_most(len(body.stop_token_ids or ()), limits.max_stop_token_ids, "stop_token_ids", "stop token ids")
    _at_most(len(body.logit_bias or {}), limits.max_logit_bias, "logit_bias", "logit_bias entries")
    _at_most(num_prompts, limits.max_prompts, "prompt", "prompts in one request")
    _at_most(num_prompts * body.n, limits.max_sequences, "n", "sequences (prompts x n) in one request")


def _at_most(count: int, bound: int, param: str, what: str) -> None:
    if count > bound:
        raise bad_request(f"at most {bound} {what}, got {count}", param)
