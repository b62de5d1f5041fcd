"""The router's HTTP connections: uvicorn's httptools protocol with the deadlines and the bound it lacks.

    uvicorn.Config(app, http=protocol_for(ConnectionLimits()), ...)

uvicorn bounds an idle keep-alive connection (5 s) and nothing else: a client that opens a connection and
sends nothing, or a header one byte a minute (slowloris), or a body that never ends, holds its socket for
good, and a client that stops reading a response pins the stream that writes it. Here each connection has

- a header deadline: from the connection (or the first byte of the next request) to the end of its headers;
- a body deadline: from the end of the headers to the end of the body;
- a write deadline: while the client reads nothing (the transport's buffer stays above its high-water mark
  and uvicorn has paused the writer) for this long, the connection is dropped;
- a bound on open connections: one more is answered 503 and closed before it is read.

A connection dropped by a deadline is a disconnect to the app: `receive` answers `http.disconnect` and
`send` returns at once, so the stream that wrote it ends and its sequences are aborted (`router.sse_stream`).
A deadline that ends a request before its response began is answered 408 first.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
from dataclasses import dataclass
from http import HTTPStatus

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from router.errors import APIError

log = logging.getLogger(__name__)

# File descriptors kept for everything else the router opens (ZMQ sockets to workers, files, Ray).
_FDS_KEPT = 256


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float = 10.0  # connection (or next request) to the end of its headers
    body_timeout_s: float = 60.0  # end of the headers to the end of the body
    # A client that reads nothing of a response for this long is dropped (its sequences are aborted).
    write_timeout_s: float = 30.0
    max_connections: int = 4096  # open connections; one more is answered 503 and closed (at most the fd limit)
    # Bytes of a stream's events made but not yet taken by the client's connection; a stream that falls
    # further behind ends with an error event and its sequences are aborted (router.sse_stream).
    max_stream_backlog_bytes: int = 4 << 20


def protocol_for(limits: ConnectionLimits) -> type[HttpToolsProtocol]:
    """uvicorn's `http` protocol class, with `limits` (and a connection bound the fd limit can hold)."""
    files = open_files_limit()
    allowed = min(limits.max_connections, files - _FDS_KEPT)
    if allowed < limits.max_connections:
        log.warning("at most %d connections: the open-files limit is %d", allowed, files)
    return type("GuardedHttpProtocol", (GuardedHttpProtocol,), {"limits": limits, "max_connections": allowed})


def open_files_limit() -> int:
    """Raise this process's soft open-files limit to its hard limit (each connection is a descriptor, and
    1,024, a common default, is below a few thousand clients); the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = 1 << 20 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


class GuardedHttpProtocol(HttpToolsProtocol):
    """One connection. The deadlines are timers on the event loop, armed and cancelled by the parser's
    callbacks and the transport's flow control; each drops the connection when it fires."""

    limits: ConnectionLimits = ConnectionLimits()
    max_connections: int = ConnectionLimits.max_connections

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._deadline: asyncio.TimerHandle | None = None
        self._write_deadline: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            message = f"the server is at its limit of {self.max_connections} connections; retry later"
            transport.write(_error(503, message, "too_many_connections"))
            transport.close()
            return
        self._arm(self.limits.header_timeout_s, "headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._write_deadline is not None:
            self._write_deadline.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._deadline is None and (self.cycle is None or self.cycle.response_complete):
            self._arm(self.limits.header_timeout_s, "headers")  # the first byte of the next request
        super().data_received(data)

    def on_headers_complete(self) -> None:
        self._arm(self.limits.body_timeout_s, "body")
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_deadline is None:
            self._write_deadline = self.loop.call_later(self.limits.write_timeout_s, self._drop, "write")

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._write_deadline is not None:
            self._write_deadline.cancel()
            self._write_deadline = None

    def _arm(self, seconds: float, what: str) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._drop, what)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _drop(self, what: str) -> None:
        """A deadline passed: answer 408 if the request's response has not begun, then drop the connection."""
        self._deadline = None
        if self.transport.is_closing():
            return
        if what == "headers" or (what == "body" and not self.cycle.response_started):
            self.transport.write(_error(408, f"the request's {what} did not arrive in time", "request_timeout"))
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True  # the app's `receive` says so and its `send` returns at once
            self.cycle.message_event.set()
        if what == "write":
            self.transport.abort()  # what the client did not read is dropped, not flushed
        else:
            self.transport.close()


def _error(status: int, message: str, code: str) -> bytes:
    """A whole HTTP/1.1 response carrying the router's OpenAI-format error, closing the connection."""
    body = json.dumps(APIError(status, message, code=code).body()).encode()
    head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")  # fmt: skip
    return head.encode() + body
