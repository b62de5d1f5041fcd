"""A streamed response (server-sent events) whose client can be slow, or gone, without pinning capacity.

    return SSEStream(running, payloads, max_backlog_bytes)

Two tasks per stream. The *pump* takes the request's updates as fast as the workers make them and frames
each payload as an event into a buffer; the *writer* hands the buffer to the client's connection, all of
what is ready in one write, as fast as the client reads.

Ownership: the pump closes `running` when the last choice has finished (or the request failed): the
sequences' admission is given back then, not when the client has read everything. A client that goes
away closes it at once (its unfinished sequences are aborted on their workers). A client that falls
behind by more than `max_backlog_bytes` gets an error event where its stream was cut, and the pump closes
`running` then; one that reads nothing at all is dropped by the connection's write deadline
(`router.http_protocol`). So a stream holds at most its backlog bound in memory, and never a worker.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from typing import AsyncIterator

from starlette.responses import Response

from router.errors import APIError, internal_error
from router.serving import RunningRequest

_DONE = b"data: [DONE]\n\n"
# Characters that JSON leaves raw but `str.splitlines` ends a line at: a client that splits an event stream
# into lines that way (httpx's `iter_lines`) would cut an event holding one in two. Escaped, they are the
# same JSON string to every reader.
_LINE_BREAKS_JSON_KEEPS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def event(payload: dict) -> bytes:
    text = json.dumps(payload, ensure_ascii=False)
    if not text.isascii():  # a flag on the string: most events skip the second pass over their text
        text = text.translate(_LINE_BREAKS_JSON_KEEPS)
    return f"data: {text}\n\n".encode()


class SSEStream(Response):
    """A starlette `Response` (what FastAPI passes through as it is) that writes itself; no length: chunked."""

    def __init__(self, running: RunningRequest, payloads: AsyncIterator[dict], max_backlog_bytes: int):
        self.status_code, self.background = 200, None
        self.raw_headers = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
        self.running, self.payloads, self.max_backlog_bytes = running, payloads, max_backlog_bytes
        self._events: deque[bytes] = deque()
        self._backlog = 0  # bytes made and not yet written: in `_events` and in the write under way
        self._ready = asyncio.Event()  # set when `_events` gained something or the pump ended
        self._pumped = False

    async def __call__(self, scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        tasks = [asyncio.create_task(self._pump()), asyncio.create_task(self._write(send)),
                 asyncio.create_task(until_disconnected(receive))]  # fmt: skip
        pump, writer, gone = tasks
        try:
            await asyncio.wait((writer, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.running.close()  # the client went (or this task was cancelled): abort what is unfinished
        if writer.done() and not writer.cancelled() and writer.exception() is not None:
            raise writer.exception()

    async def _pump(self) -> None:
        try:
            async for payload in self.payloads:
                if not self._add(event(payload)):
                    raise APIError(503, f"the client fell more than {self.max_backlog_bytes} bytes behind "
                                   "this stream; it was cut off", code="stream_backlog_exceeded")  # fmt: skip
        except APIError as err:
            self._add(event(err.body()), bounded=False)
        except Exception as err:  # a bug: logged with an id the client gets
            self._add(event(internal_error("the stream failed", err).body()), bounded=False)
        finally:
            await self.payloads.aclose()  # the choices' generators end now, before admission is given back
            self.running.close()
            self._add(_DONE, bounded=False)
            self._pumped = True

    def _add(self, data: bytes, bounded: bool = True) -> bool:
        if bounded and self._backlog + len(data) > self.max_backlog_bytes:
            return False
        self._events.append(data)
        self._backlog += len(data)
        self._ready.set()
        return True

    async def _write(self, send) -> None:
        while True:
            await self._ready.wait()
            self._ready.clear()
            pumped = self._pumped  # read before taking the events: the pump adds its last ones before this
            if self._events:
                data = b"".join(self._events)
                self._events.clear()
                await send({"type": "http.response.body", "body": data, "more_body": True})
                self._backlog -= len(data)
            if pumped and not self._events:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return


async def until_disconnected(receive) -> None:
    """Returns when the client has gone (the body is read: the next ASGI message can only be the disconnect)."""
    while (await receive())["type"] != "http.disconnect":
        pass
