"""POST /v1/completions: text (or token-id) prompts in, `text_completion` objects out, whole or streamed."""

from __future__ import annotations

import time
from typing import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse

from router.api_models import CompletionRequest
from router.errors import bad_request
from router.openai_common import (CHAT_ONLY, check_model, collect, refuse_unsupported, response_id, sampling_from, sse_response,
                                  text_options_from)  # fmt: skip
from router.served_model import ServedModel
from router.serving import RequestRunner, RunningRequest


async def create_completion(body: CompletionRequest, runner: RequestRunner, request: Request):
    arrived = time.monotonic()
    model = runner.model
    check_model(body.model, model.name)
    refuse_unsupported(body, echo=(False,), suffix=(None, ""), best_of=(None, body.n), **CHAT_ONLY)
    prompts = _prompt_ids(body.prompt, model)
    max_tokens = [model.max_tokens_for(len(p), body.max_tokens) for p in prompts]
    sampling = sampling_from(body, body.logprobs, model.vocab_size)
    running = await runner.start(prompts, sampling, text_options_from(body), body.n, arrived, max_tokens)
    rid, created = response_id("cmpl")
    if body.stream:
        usage = body.stream_options is not None and body.stream_options.include_usage
        return sse_response(running, _chunks(running, rid, created, model, body.logprobs is not None, usage))
    choices = await collect(running, request)
    # A `CompletionResponse` as a plain dict: building and dumping the pydantic model costs every request.
    return JSONResponse(content={
        "id": rid, "object": "text_completion", "created": created, "model": model.name,
        "choices": [
            {"index": i, "text": c["text"],
             "logprobs": _logprobs(model, c["token_ids"], c["logprobs"]) if body.logprobs is not None else None,
             "finish_reason": c["finish_reason"]}
            for i, c in sorted(choices.items())
        ],
        "usage": running.usage(),
    })  # fmt: skip


async def _chunks(running: RunningRequest, rid: str, created: int, model: ServedModel, logprobs: bool,
                  include_usage: bool) -> AsyncIterator[dict]:  # fmt: skip
    base = {"id": rid, "object": "text_completion", "created": created, "model": model.name}
    async for update in running.updates():
        if not (update.text or update.final or (logprobs and update.token_ids)):
            continue  # text held back (a possible stop string): nothing to show yet
        choice = {"index": update.index, "text": update.text, "finish_reason": update.finish_reason,
                  "logprobs": _logprobs(model, update.token_ids, update.logprobs) if logprobs else None}  # fmt: skip
        yield {**base, "choices": [choice]}
    if include_usage:
        yield {**base, "choices": [], "usage": running.usage()}


def _prompt_ids(prompt, model: ServedModel) -> list[list[int]]:
    """One token-id list per prompt: a string, strings, token ids, or lists of token ids."""
    if isinstance(prompt, str):
        prompts = [model.encode(prompt)]
    elif prompt and all(isinstance(p, str) for p in prompt):
        prompts = [model.encode(p) for p in prompt]
    elif prompt and all(isinstance(p, int) for p in prompt):
        prompts = [list(prompt)]
    elif prompt and all(isinstance(p, list) for p in prompt):
        prompts = [list(p) for p in prompt]
    else:
        raise bad_request("prompt must be a string, a list of strings, token ids, or lists of token ids", "prompt")
    for ids in prompts:
        model.check_ids(ids)
    return prompts


def _logprobs(model: ServedModel, token_ids: list[int], logprobs: list) -> dict:
    tokens = [model.token_text(t) for t in token_ids]
    offsets, at = [], 0
    for text in tokens:
        offsets.append(at)
        at += len(text)
    return {
        "tokens": tokens,
        "token_logprobs": [lp.logprob for lp in logprobs],
        "top_logprobs": [{model.token_text(t): v for t, v in lp.top} for lp in logprobs],
        "text_offset": offsets,
    }
