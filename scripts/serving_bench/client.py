"""One streamed request to an OpenAI-compatible server, timed chunk by chunk (aiohttp, SSE).

Owns nothing beyond the call: the caller's `aiohttp.ClientSession` carries the connections.
Times are `time.perf_counter()` seconds; ITLs are the gaps between chunks that carry text
(a chunk may hold several tokens; as vLLM's client does, each chunk counts once).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import aiohttp

from .datasets import SampleRequest

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"


@dataclass
class RequestOutput:
    prompt_len: int
    start_time: float = 0.0  # perf_counter when sent
    queue_time: float = 0.0  # s from its arrival time to its send, waiting for a --max-concurrency slot
    success: bool = False
    ttft: float = 0.0  # s
    latency: float = 0.0  # s, end to end
    itl: list[float] = field(default_factory=list)  # s, between text chunks after the first
    output_tokens: int = 0  # from the server's usage (0 when it sent none)
    generated_text: str = ""
    error: str = ""


def request_body(endpoint: str, model: str, sample: SampleRequest, ignore_eos: bool, extra: dict) -> dict:
    body = {"model": model, "max_tokens": sample.expected_output_len, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}, **extra}  # fmt: skip
    if ignore_eos:
        body["ignore_eos"] = True
    if endpoint == CHAT:
        body["messages"] = [{"role": "user", "content": sample.prompt}]
    else:
        body["prompt"] = sample.prompt
    return body


def _chunk_text(chunk: dict, endpoint: str) -> str:
    if not chunk.get("choices"):
        return ""
    choice = chunk["choices"][0]
    return (choice.get("delta", {}).get("content") or "") if endpoint == CHAT else (choice.get("text") or "")


async def _read_stream(response: aiohttp.ClientResponse, endpoint: str, out: RequestOutput) -> None:
    """Time each text chunk of the SSE stream into `out` (ttft, itl, text, usage) up to `[DONE]`."""
    texts, last = [], out.start_time
    async for raw in response.content:
        line = raw.decode().strip()
        if not line.startswith("data:"):
            continue
        data = line.removeprefix("data:").strip()
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        if chunk.get("usage"):
            out.output_tokens = chunk["usage"].get("completion_tokens") or 0
        if text := _chunk_text(chunk, endpoint):
            now = time.perf_counter()
            if texts:
                out.itl.append(now - last)
            else:
                out.ttft = now - out.start_time
            last = now
            texts.append(text)
    out.generated_text = "".join(texts)


async def send_request(session: aiohttp.ClientSession, url: str, endpoint: str, body: dict,
                       prompt_len: int) -> RequestOutput:  # fmt: skip
    """POST `body` with stream=True and read the SSE stream to its `[DONE]`; errors land in `.error`."""
    out = RequestOutput(prompt_len)
    out.start_time = time.perf_counter()
    try:
        async with session.post(url + endpoint, json=body) as response:
            if response.status == 200:
                await _read_stream(response, endpoint, out)
            else:
                out.error = f"HTTP {response.status}: {(await response.text())[:500]}"
    except (aiohttp.ClientError, TimeoutError, ValueError) as e:
        out.error = f"{type(e).__name__}: {e}"
    out.latency = time.perf_counter() - out.start_time  # a failed request held its slot this long
    if not out.error and not out.generated_text:
        out.error = "the stream ended with no text"
    out.success = not out.error
    return out
