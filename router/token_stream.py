"""The router's end of the token stream: one bound zmq.asyncio PULL, deltas routed to per-request queues.

Workers PUSH `TokenDelta`s (msgpack, never pickle) to `address`; a reader task
on the router's event loop decodes them and hands each to the `RequestOutputs`
of its request. Deltas of one request come from two workers (prefill sends the
first token, decode the rest) and may cross: `RequestOutputs.chunks()` puts
them back in order, like `kvtransfer.token_stream.TokenStream` does for a
synchronous reader, and ends once the final delta and every token before it
have arrived. Deltas for a request nobody waits for (it was aborted) are dropped.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import AsyncIterator

import zmq
import zmq.asyncio

from kvtransfer.codec import DecodeError, decode
from kvtransfer.protocol import TokenDelta, TokenLogprob
from kvtransfer.socket_security import ClusterKey, bind_secured, refuse

logger = logging.getLogger("tandem.router")


class StreamFailed(RuntimeError):
    """The request's output will never complete (its worker died)."""


@dataclass
class OutputChunk:
    """Output tokens in order, continuing the previous chunk; `final` is set on the last one."""

    token_ids: list[int]
    logprobs: list[TokenLogprob] = field(default_factory=list)  # aligned with token_ids when asked for
    final: TokenDelta | None = None


class RequestOutputs:
    """One request's deltas, reassembled in output order.

    The queue has no bound of its own: it holds only this request's deltas (at
    most max_tokens + 1, the worker's own output), and only while the request is
    open; the router admits at most `max_in_flight` of them."""

    def __init__(self):
        self._queue: asyncio.Queue[TokenDelta | StreamFailed] = asyncio.Queue()
        self._tokens: dict[int, tuple[int, TokenLogprob | None]] = {}  # output index -> (token, logprob)
        self._next = 0  # output index of the next token to hand out
        self._final: TokenDelta | None = None

    def put(self, item: TokenDelta | StreamFailed) -> None:
        self._queue.put_nowait(item)

    async def chunks(self) -> AsyncIterator[OutputChunk]:
        """Yield what is ready, in order, each time deltas arrive; raises `StreamFailed`."""
        while True:
            self._add(await self._queue.get())
            while not self._queue.empty():
                self._add(self._queue.get_nowait())
            chunk = self._take_ready()
            if chunk.token_ids or chunk.final is not None:
                yield chunk
            if chunk.final is not None:
                return

    def _add(self, item: TokenDelta | StreamFailed) -> None:
        if isinstance(item, StreamFailed):
            raise item
        logprobs = item.logprobs or (None,) * len(item.token_ids)
        for i, (token, logprob) in enumerate(zip(item.token_ids, logprobs)):
            self._tokens[item.first_index + i] = (token, logprob)
        if item.finished:
            self._final = item

    def _take_ready(self) -> OutputChunk:
        chunk = OutputChunk([])
        while self._next in self._tokens:
            token, logprob = self._tokens.pop(self._next)
            chunk.token_ids.append(token)
            if logprob is not None:
                chunk.logprobs.append(logprob)
            self._next += 1
        if self._final is not None and self._next >= self._final.num_output_tokens:
            chunk.final = self._final
        return chunk


class TokenStreamConsumer:
    """Bound on `start()` (on the router's loop); `open(request_id)` before the request is sent anywhere.

    `key`: the cluster key workers authenticate with (None: the process's, if any; see
    `kvtransfer.socket_security`). Undecodable or wrong-type messages are refused and counted."""

    def __init__(self, address: str = "tcp://127.0.0.1:0", key: ClusterKey | None = None):
        self._bind_address, self._key = address, key
        self.address = ""
        self._requests: dict[str, RequestOutputs] = {}
        self._sock: zmq.asyncio.Socket | None = None
        self._reader: asyncio.Task | None = None

    async def start(self) -> None:
        self._sock = zmq.asyncio.Context.instance().socket(zmq.PULL)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.RCVHWM, 0)  # never drop a delta: a slow router queues them (see `RequestOutputs`)
        self.address = bind_secured(self._sock, self._bind_address, "token_stream", key=self._key)
        self._reader = asyncio.get_running_loop().create_task(self._read(), name="token-stream")

    def open(self, request_id: str) -> RequestOutputs:
        outputs = self._requests[request_id] = RequestOutputs()
        return outputs

    def close_request(self, request_id: str) -> None:
        self._requests.pop(request_id, None)

    def fail(self, request_id: str, reason: str) -> None:
        outputs = self._requests.get(request_id)
        if outputs is not None:
            outputs.put(StreamFailed(reason))

    async def _read(self) -> None:
        while True:
            frames = await self._sock.recv_multipart(copy=True)
            try:
                delta = decode(frames[0], TokenDelta)
            except DecodeError as err:
                refuse("token_stream", err.reason, err)
                continue
            outputs = self._requests.get(delta.request_id)
            if outputs is not None:
                outputs.put(delta)

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        if self._sock is not None:
            self._sock.close(linger=0)
