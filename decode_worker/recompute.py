"""Recompute: a request whose KV transfer failed is prefilled by the decode engine itself.

When the prefill worker's first token already reached decode (the router has
streamed it), the local request continues after it: its prompt is the
original prompt plus that token and it may make one token fewer; the decode
worker numbers its output from 1 (`spliced`). Otherwise the prompt alone is
prefilled and the first token computed here (greedy and seeded sampling give
the token the prefill worker would have; the router keeps the first one it got).
"""

from __future__ import annotations

import dataclasses

from engine.llm_engine import LLMEngine
from engine.request import Request


def requeue_locally(engine: LLMEngine, req: Request, first_token: int | None) -> tuple[int, str | None]:
    """Queue `req` (already aborted on `engine`) again as a local prefill under the same id.

    Returns (tokens spliced before the local output, finish reason when nothing is left to make: then
    nothing was queued). Raises ValueError (nothing queued) if the engine refuses it."""
    p, done = req.params, [] if first_token is None else [first_token]
    if first_token is not None and (first_token in p.stop_token_ids or
                                    (not p.ignore_eos and first_token in req.eos_token_ids)):  # fmt: skip
        return len(done), "stop"
    left = req.max_tokens - len(done)
    if left <= 0:
        return len(done), "length"
    params = dataclasses.replace(p, max_tokens=left, min_tokens=max(0, p.min_tokens - len(done)),
                                 resumed_output_tokens=p.resumed_output_tokens + len(done))  # fmt: skip
    engine.add_request(req.request_id, list(req.prompt_token_ids) + done, params)
    return len(done), None
