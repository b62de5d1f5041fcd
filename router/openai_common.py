"""Pieces the completions and chat endpoints share: model check, sampling and text options from a body, SSE
framing, ids."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Iterator

from fastapi import Request

from output_text import TextOptions
from router.api_models import _GenerationFields
from router.errors import APIError, bad_request
from router.serving import RunningRequest
from router.sse_stream import until_disconnected
from router.structured_request import structured_from
from wire.requests import SamplingSpec
from wire.sampling_rules import SamplingOutOfRange


def logprob_ids(token_ids: list[int], logprobs: list, top: int | None = None) -> Iterator[int]:
    """The ids whose texts logprobs show: each token, and the first `top` of its alternatives (all: None)."""
    yield from token_ids
    for lp in logprobs:
        if lp is not None:
            yield from (alt for alt, _ in lp.top[:top])


def check_model(asked: str, served_name: str) -> None:
    """404 unless the request names the served model."""
    if asked != served_name:
        raise APIError(404, f"the model {asked!r} does not exist; this server serves {served_name!r}",
                       "model", "model_not_found")  # fmt: skip


# Fields Tandem cannot honour yet, and the values of each that ask for nothing.
NOT_HONOURED = {"functions": (None, []), "function_call": (None, "none")}
# Fields of chat completions only: refused on /v1/completions unless neutral.
CHAT_ONLY = {"tools": (None, []), "tool_choice": (None, "none")}


def refuse_unsupported(body: _GenerationFields, **extra_defaults) -> None:
    """400 for a field Tandem cannot honour that is set to anything but its neutral value."""
    for name, neutral in {**NOT_HONOURED, **extra_defaults}.items():
        value = getattr(body, name)
        if value not in neutral:
            shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
            raise bad_request(f"{name}={shown} is not supported", name)


def sampling_from(body: _GenerationFields, vocab_size: int, max_tokens: int, logprobs: int | None,
                  prompt_logprobs: int | None = None, structured: tuple[str, str] | None = None,
                  names: dict[str, str] | None = None) -> SamplingSpec:  # fmt: skip
    """The wire sampling parameters, checked (a 400 naming the field as the client named it: `names` maps a
    SamplingSpec field to it). `max_tokens`: the least any sequence gets (each gets its own later)."""
    if any(not 0 <= t < vocab_size for t in body.stop_token_ids or ()):
        raise bad_request(f"stop_token_ids must be in [0, {vocab_size})", "stop_token_ids")
    asked = structured_from(body)  # a malformed ask is a 400 even where tool calling decides the grammar
    try:
        return SamplingSpec(
            logit_bias=logit_bias_from(body.logit_bias or {}, vocab_size),
            temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, min_p=body.min_p, seed=body.seed,
            repetition_penalty=body.repetition_penalty, presence_penalty=body.presence_penalty,
            frequency_penalty=body.frequency_penalty, max_tokens=max_tokens, min_tokens=body.min_tokens,
            stop_token_ids=tuple(body.stop_token_ids or ()), ignore_eos=body.ignore_eos, logprobs=logprobs,
            prompt_logprobs=prompt_logprobs, structured=structured or asked, cache_salt=body.cache_salt,
        )  # fmt: skip
    except SamplingOutOfRange as err:
        param = (names or {}).get(err.param, err.param)
        raise bad_request(str(err).replace(err.param, param, 1), param) from None


def logit_bias_from(bias: dict[str, float], vocab_size: int) -> tuple[tuple[int, float], ...]:
    """OpenAI's {"token id": bias} as sorted (id, bias) pairs; 400 for a key that is no token id of the
    vocabulary or a bias outside [-100, 100]."""
    pairs = {}
    for key, value in bias.items():
        if not key.isdigit() or int(key) >= vocab_size:
            raise bad_request(f"logit_bias keys must be token ids in [0, {vocab_size}), got {key!r}", "logit_bias")
        if not -100.0 <= value <= 100.0:
            raise bad_request(f"logit_bias values must be in [-100, 100], got {value!r}", "logit_bias")
        pairs[int(key)] = float(value)
    return tuple(sorted(pairs.items()))


def text_options_from(body: _GenerationFields) -> TextOptions:
    """How the router makes each choice's text: stop strings stay here, no worker sees them."""
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    if any(not s for s in stop):
        raise bad_request("stop strings must not be empty", "stop")
    return TextOptions(stop, body.include_stop_str_in_output, body.skip_special_tokens, body.min_tokens)


def response_id(prefix: str) -> tuple[str, int]:
    return f"{prefix}-{uuid.uuid4().hex}", int(time.time())


async def collect(running: RunningRequest, request: Request) -> dict[int, dict]:
    """Every choice's full text, token logprobs and finish reason (non-streaming responses).

    A client that disconnects meanwhile gets its sequences aborted on the workers at once."""
    gone = asyncio.ensure_future(until_disconnected(request.receive))
    this = asyncio.current_task()

    def stop_collecting(watcher: asyncio.Future) -> None:
        if not watcher.cancelled():
            this.cancel()

    gone.add_done_callback(stop_collecting)
    try:
        return await _gather(running)
    except asyncio.CancelledError:
        if gone.done() and not gone.cancelled():
            raise APIError(400, "the client disconnected") from None
        raise
    finally:
        gone.remove_done_callback(stop_collecting)
        gone.cancel()
        running.close()


async def _gather(running: RunningRequest) -> dict[int, dict]:
    out = {c.index: {"text": "", "logprobs": [], "token_ids": [], "finish_reason": None, "prompt_logprobs": ()}
           for c in running.choices}  # fmt: skip
    async for update in running.updates():
        choice = out[update.index]
        choice["prompt_logprobs"] = update.prompt_logprobs or choice["prompt_logprobs"]
        choice["text"] += update.text
        choice["logprobs"] += update.logprobs
        choice["token_ids"] += update.token_ids
        choice["finish_reason"] = update.finish_reason or choice["finish_reason"]
    return out
