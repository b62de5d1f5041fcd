"""POST /v1/completions: text (or token-id) prompts in, `text_completion` objects out, whole or streamed."""

from __future__ import annotations

import itertools
import time
from typing import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse

from router.api_models import CompletionRequest, prompt_kind
from router.errors import bad_request
from router.openai_common import (CHAT_ONLY, check_model, collect, logprob_ids, refuse_unsupported, response_id,
                                  sampling_from, text_options_from)  # fmt: skip
from router.limits import check_limits
from router.prompt_echo import prompt_logprobs_asked, prompt_texts, vllm_prompt_logprobs
from router.served_model import ServedModel
from router.sse_stream import SSEStream
from router.serving import RequestRunner, RunningRequest


async def create_completion(body: CompletionRequest, runner: RequestRunner, request: Request):
    arrived = time.monotonic()
    model = runner.model
    check_model(body.model, model.name)
    refuse_unsupported(body, suffix=(None, ""), best_of=(None, body.n), **CHAT_ONLY)
    # Prompts counted by the form the body's model validated, without tokenizing any.
    check_limits(body, runner.limits, len(body.prompt) if prompt_kind(body.prompt) in ("texts", "id_lists") else 1)
    prompts = await _prompt_ids(body.prompt, model)
    max_tokens = [model.max_tokens_for(len(p), body.max_tokens) for p in prompts]
    sampling = sampling_from(body, model.vocab_size, min(max_tokens), body.logprobs, prompt_logprobs_asked(body))
    running = await runner.start(prompts, sampling, text_options_from(body), body.n, arrived, max_tokens)
    rid, created = response_id("cmpl")
    echo = _Echo(body, prompts, await prompt_texts(body.prompt, prompts, model) if body.echo else [], model)
    if body.stream:
        usage = body.stream_options is not None and body.stream_options.include_usage
        return SSEStream(running, _chunks(running, rid, created, model, echo, usage), runner.max_stream_backlog_bytes)
    choices = await collect(running, request)
    parts = {i: await echo.choice(i, c["text"], c["token_ids"], c["logprobs"], c["prompt_logprobs"])
             for i, c in sorted(choices.items())}  # fmt: skip
    # A `CompletionResponse` as a plain dict: building and dumping the pydantic model costs every request.
    return JSONResponse(content={
        "id": rid, "object": "text_completion", "created": created, "model": model.name,
        "choices": [{"index": i, **parts[i], "finish_reason": c["finish_reason"]} for i, c in sorted(choices.items())],
        "usage": running.usage(), "phases": running.phases(),
    })  # fmt: skip


class _Echo:
    """A choice's text and logprobs as the body asked: with the prompt's before them (`echo`), and vLLM's
    `prompt_logprobs` beside them. Choice i answers prompt i // n."""

    def __init__(self, body: CompletionRequest, prompts: list[list[int]], texts: list[str], model: ServedModel):
        self.body, self.prompts, self.texts, self.model = body, prompts, texts, model
        self.echoed: set[int] = set()  # streamed choices whose prompt went out

    async def choice(self, index: int, text: str, token_ids: list[int], logprobs: list, prompt_entries) -> dict:
        body = self.body
        prompt = self.prompts[index // body.n]
        if self.pending(index):  # the prompt's text and entries first (nulls if none arrived: it ended first)
            self.echoed.add(index)
            text = self.texts[index // body.n] + text
            token_ids, logprobs = prompt + token_ids, [*(prompt_entries or [None] * len(prompt)), *logprobs]
        shown = body.logprobs is not None
        vllm_prompt = body.prompt_logprobs is not None and bool(prompt_entries)
        # Every text this choice shows, in one batched tokenizer call (on a thread for a long echoed prompt).
        texts = await self.model.token_texts_async(itertools.chain(
            logprob_ids(token_ids, logprobs, body.logprobs) if shown else (),
            logprob_ids(prompt, prompt_entries, body.prompt_logprobs) if vllm_prompt else ()))  # fmt: skip
        out = {"text": text, "logprobs": _logprobs(texts, token_ids, logprobs, body.logprobs) if shown else None}
        if vllm_prompt:
            out["prompt_logprobs"] = vllm_prompt_logprobs(texts, prompt, prompt_entries, body.prompt_logprobs)
        return out

    def pending(self, index: int) -> bool:
        """Whether a streamed choice still owes its prompt (its first chunk goes out even without new text)."""
        return self.body.echo and index not in self.echoed


async def _chunks(running: RunningRequest, rid: str, created: int, model: ServedModel, echo: _Echo,
                  include_usage: bool) -> AsyncIterator[dict]:  # fmt: skip
    base = {"id": rid, "object": "text_completion", "created": created, "model": model.name}
    logprobs = echo.body.logprobs is not None
    async for update in running.updates():
        # A chunk for every token made, even one whose text is not out yet (the start of a character, a possible
        # stop string): vLLM's server sends those too, and its clients time the first token and every gap by them.
        if not (update.text or update.token_ids or update.final or echo.pending(update.index)
                or update.prompt_logprobs):  # fmt: skip
            continue
        parts = await echo.choice(update.index, update.text, update.token_ids, update.logprobs,
                                  update.prompt_logprobs)  # fmt: skip
        yield {**base, "choices": [{"index": update.index, **parts, "finish_reason": update.finish_reason}]}
    if include_usage:
        yield {**base, "choices": [], "usage": running.usage(), "phases": running.phases()}


async def _prompt_ids(prompt, model: ServedModel) -> list[list[int]]:
    """One token-id list per prompt: a string, strings, token ids, or lists of token ids (the body's model
    has made every element of a list the same kind: its first says which)."""
    if isinstance(prompt, str):
        prompts = [await model.encode_async(prompt)]
    elif not prompt:
        raise bad_request("prompt must not be empty", "prompt")
    elif isinstance(prompt[0], str):
        prompts = [await model.encode_async(p) for p in prompt]
    elif isinstance(prompt[0], int):
        prompts = [prompt]
    else:
        prompts = prompt
    for ids in prompts:
        model.check_ids(ids)
    return prompts


def _logprobs(texts: dict[int, str], token_ids: list[int], logprobs: list, top: int | None = None) -> dict:
    """OpenAI's completion `logprobs`, `texts` each token's (`ServedModel.token_texts`); an entry None (an
    echoed prompt's first token) is null, and `top` cuts each entry's alternatives (prompt entries may carry
    more than `logprobs` asked: `prompt_logprobs`)."""
    tokens = [texts[t] for t in token_ids]
    offsets, at = [], 0
    for text in tokens:
        offsets.append(at)
        at += len(text)
    return {
        "tokens": tokens,
        "token_logprobs": [lp.logprob if lp is not None else None for lp in logprobs],
        "top_logprobs": [{texts[t]: v for t, v in lp.top[:top]} if lp is not None else None
                         for lp in logprobs],  # fmt: skip
        "text_offset": offsets,
    }
