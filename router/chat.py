"""POST /v1/chat/completions: messages through the model's chat template, `chat.completion` objects out."""

from __future__ import annotations

import time
from typing import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse

from router.api_models import ChatCompletionRequest, ChatCompletionResponse
from router.errors import bad_request
from router.openai_common import (check_model, collect, refuse_unsupported, response_id, sampling_from, sse_response,
                                  text_options_from)  # fmt: skip
from router.served_model import ServedModel
from router.serving import RequestRunner, RunningRequest


async def create_chat_completion(body: ChatCompletionRequest, runner: RequestRunner, request: Request):
    arrived = time.monotonic()
    model = runner.model
    check_model(body.model, model.name)
    refuse_unsupported(body)
    if body.top_logprobs is not None and not body.logprobs:
        raise bad_request("top_logprobs needs logprobs=true", "top_logprobs")
    prompt = model.encode_chat([m.model_dump(exclude_none=True) for m in body.messages])
    param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    max_tokens = model.max_tokens_for(len(prompt), body.max_tokens_asked, param)
    sampling = sampling_from(body, (body.top_logprobs or 0) if body.logprobs else None, model.vocab_size)
    running = await runner.start([prompt], sampling, text_options_from(body), body.n, arrived, [max_tokens])
    rid, created = response_id("chatcmpl")
    if body.stream:
        usage = body.stream_options is not None and body.stream_options.include_usage
        return sse_response(running, _chunks(running, rid, created, model, body.logprobs, usage))
    choices = await collect(running, request)
    return JSONResponse(content=ChatCompletionResponse(
        id=rid, created=created, model=model.name, usage=running.usage(),
        choices=[
            {"index": i, "message": {"role": "assistant", "content": c["text"]}, "finish_reason": c["finish_reason"],
             "logprobs": _logprobs(model, c["token_ids"], c["logprobs"]) if body.logprobs else None}
            for i, c in sorted(choices.items())
        ],
    ).model_dump())  # fmt: skip


async def _chunks(running: RunningRequest, rid: str, created: int, model: ServedModel, logprobs: bool,
                  include_usage: bool) -> AsyncIterator[dict]:  # fmt: skip
    base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model.name}
    for choice in running.choices:  # the assistant's turn opens before any content, as OpenAI streams it
        yield {**base, "choices": [{"index": choice.index, "delta": {"role": "assistant", "content": ""},
                                    "logprobs": None, "finish_reason": None}]}  # fmt: skip
    async for update in running.updates():
        if not (update.text or update.final or (logprobs and update.token_ids)):
            continue
        delta = {"content": update.text} if update.text else {}
        choice = {"index": update.index, "delta": delta, "finish_reason": update.finish_reason,
                  "logprobs": _logprobs(model, update.token_ids, update.logprobs) if logprobs else None}  # fmt: skip
        yield {**base, "choices": [choice]}
    if include_usage:
        yield {**base, "choices": [], "usage": running.usage()}


def _logprobs(model: ServedModel, token_ids: list[int], logprobs: list) -> dict:
    def entry(token_id: int, logprob: float) -> dict:
        text = model.token_text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return {
        "content": [
            {**entry(t, lp.logprob), "top_logprobs": [entry(alt, v) for alt, v in lp.top]}
            for t, lp in zip(token_ids, logprobs)
        ]
    }
