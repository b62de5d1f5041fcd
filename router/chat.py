"""POST /v1/chat/completions: messages through the model's chat template, `chat.completion` objects out."""

from __future__ import annotations

import time
from typing import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse

from router.api_models import ChatCompletionRequest, ChatCompletionResponse
from router.errors import bad_request
from router.openai_common import (check_model, collect, logprob_ids, refuse_unsupported, response_id, sampling_from,
                                  text_options_from)  # fmt: skip
from router.limits import check_limits
from router.served_model import ServedModel
from router.tool_calls import ToolUse, messages_for_template, new_call_id, tool_use_from
from router.sse_stream import SSEStream
from router.serving import RequestRunner, RunningRequest


async def create_chat_completion(body: ChatCompletionRequest, runner: RequestRunner, request: Request):
    arrived = time.monotonic()
    model = runner.model
    check_model(body.model, model.name)
    refuse_unsupported(body, prompt_logprobs=(None,))  # on /v1/completions only, so far
    check_limits(body, runner.limits)
    if body.top_logprobs is not None and not body.logprobs:
        raise bad_request("top_logprobs needs logprobs=true", "top_logprobs")
    tools = tool_use_from(body, model.tool_call_parser)
    messages = messages_for_template([m.model_dump(exclude_none=True) for m in body.messages])
    prompt = await model.encode_chat_async(messages, tools=list(tools.tools) if tools else None)
    param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    max_tokens = model.max_tokens_for(len(prompt), getattr(body, param), param)
    sampling = sampling_from(body, model.vocab_size, max_tokens, (body.top_logprobs or 0) if body.logprobs else None,
                             structured=tools.structured if tools is not None else None,
                             names={"logprobs": "top_logprobs", "max_tokens": param})  # fmt: skip
    running = await runner.start([prompt], sampling, text_options_from(body), body.n, arrived, [max_tokens])
    rid, created = response_id("chatcmpl")
    if body.stream:
        usage = body.stream_options is not None and body.stream_options.include_usage
        return SSEStream(running, _chunks(running, rid, created, model, body.logprobs, usage, tools),
                         runner.max_stream_backlog_bytes)  # fmt: skip
    choices = await collect(running, request)
    answers = [{"index": i, **_message_and_finish(c["text"], c["finish_reason"], tools),
                "logprobs": await _logprobs(model, c["token_ids"], c["logprobs"]) if body.logprobs else None}
               for i, c in sorted(choices.items())]  # fmt: skip
    return JSONResponse(content=ChatCompletionResponse(id=rid, created=created, model=model.name, choices=answers,
                                                       usage=running.usage(), phases=running.phases()).model_dump())


def _message_and_finish(text: str, finish_reason: str | None, tools: ToolUse | None) -> dict:
    """A finished choice's message (content, and tool_calls where the output made calls) and finish reason."""
    content, calls = tools.calls_in(text) if tools is not None else (text, [])
    if not calls:
        return {"message": {"role": "assistant", "content": content}, "finish_reason": finish_reason}
    finish = "tool_calls" if finish_reason == "stop" and tools.mode != "named" else finish_reason
    return {"message": {"role": "assistant", "content": content, "tool_calls": calls}, "finish_reason": finish}


async def _chunks(running: RunningRequest, rid: str, created: int, model: ServedModel, logprobs: bool,
                  include_usage: bool, tools: ToolUse | None) -> AsyncIterator[dict]:  # fmt: skip
    base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model.name}
    for choice in running.choices:  # the assistant's turn opens before any content, as OpenAI streams it
        yield {**base, "choices": [{"index": choice.index, "delta": {"role": "assistant", "content": ""},
                                    "logprobs": None, "finish_reason": None}]}  # fmt: skip
    deltas = {choice.index: ToolDeltas(tools) for choice in running.choices}
    async for update in running.updates():
        if not (update.text or update.token_ids or update.final):
            continue
        delta, finish = deltas[update.index].delta(update.text, update.final, update.finish_reason)
        if delta is None and not (logprobs and update.token_ids):
            continue  # tool calls held until the choice ends
        shown = await _logprobs(model, update.token_ids, update.logprobs) if logprobs else None
        choice = {"index": update.index, "delta": delta or {}, "finish_reason": finish, "logprobs": shown}
        yield {**base, "choices": [choice]}
    if include_usage:
        yield {**base, "choices": [], "usage": running.usage(), "phases": running.phases()}


class ToolDeltas:
    """One streamed choice's deltas: its text as content, or a named call's arguments as they come, or (auto,
    required) held until the choice ends and then sent as its tool calls, or its content if it made none."""

    def __init__(self, tools: ToolUse | None):
        self.tools, self.held, self.call_id = tools, "", None

    def delta(self, text: str, final: bool, finish_reason: str | None) -> tuple[dict | None, str | None]:
        """The choice's delta for this update and its finish reason; None: nothing to send yet."""
        tools = self.tools
        if tools is None or tools.mode == "none":
            # Every token is a chunk, its text possibly not out yet (as vLLM's server streams it).
            return {"content": text}, finish_reason
        if tools.mode == "named":
            return self._arguments(text), finish_reason
        self.held += text
        if not final:
            return None, None
        done = _message_and_finish(self.held, finish_reason, tools)
        message = done["message"]
        content = {"content": message["content"]} if message["content"] else {}
        calls = [{"index": i, **call} for i, call in enumerate(message.get("tool_calls", ()))]  # none: no call made
        return ({"tool_calls": calls, **content} if calls else content), done["finish_reason"]

    def _arguments(self, text: str) -> dict:
        if not text:
            return {}
        if self.call_id is None:  # the call opens with its id and name, then its arguments arrive in pieces
            self.call_id = new_call_id()
            return {"tool_calls": [{"index": 0, "id": self.call_id, "type": "function",
                                    "function": {"name": self.tools.name, "arguments": text}}]}  # fmt: skip
        return {"tool_calls": [{"index": 0, "function": {"arguments": text}}]}


async def _logprobs(model: ServedModel, token_ids: list[int], logprobs: list) -> dict:
    texts = await model.token_texts_async(logprob_ids(token_ids, logprobs))

    def entry(token_id: int, logprob: float) -> dict:
        text = texts[token_id]
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return {"content": [{**entry(t, lp.logprob), "top_logprobs": [entry(alt, v) for alt, v in lp.top]}
                        for t, lp in zip(token_ids, logprobs)]}  # fmt: skip
