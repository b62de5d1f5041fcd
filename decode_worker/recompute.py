"""Recompute: a request whose KV transfer failed is prefilled by the decode engine itself.

When the prefill worker's first token already reached decode (the router has
streamed it), the local request continues after it: its prompt is the
original prompt plus that token and it may make one token fewer; the decode
worker numbers its output from 1 (`TokenDelta.shifted`). The stop and continuation rules are
the engine's (`SamplingParams.stop_by`) and the router's (`wire.requests.continued`). Otherwise the prompt alone is
prefilled and the first token computed here (greedy and seeded sampling give
the token the prefill worker would have; the router keeps the first one it got).
"""

from __future__ import annotations

import dataclasses

from engine.llm_engine import LLMEngine
from engine.request import Request
from wire.requests import continued


def requeue_locally(engine: LLMEngine, req: Request, first_token: int | None) -> tuple[int, str | None]:
    """Queue `req` (already aborted on `engine`) again as a local prefill under the same id.

    Returns (tokens spliced before the local output, finish reason when nothing is left to make: then
    nothing was queued). Raises ValueError (nothing queued) if the engine refuses it."""
    if first_token is None:
        params, done = req.params, []
    else:
        if req.params.stop_by(first_token, 1, req.eos_token_ids) is not None:
            return 1, "stop"
        # max_tokens as the engine resolved it (None: up to the model's length)
        params, done = continued(dataclasses.replace(req.params, max_tokens=req.max_tokens), 1), [first_token]
        if params is None:
            return 1, "length"
    # Its grammar as compiled for the first attempt: the cache may have let it go, and this is the loop thread.
    grammar = req.sampling.grammar.compiled if req.sampling.grammar is not None else None
    engine.add_request(req.request_id, list(req.prompt_token_ids) + done, params, grammar)
    return len(done), None
