"""The router's end of the token stream: one bound ZMQ PULL, deltas routed to per-request queues.

Workers PUSH `TokenDelta`s (msgpack, never pickle) to `address`; a reader on
the router's event loop (the socket's FD) decodes them and hands each to the `RequestOutputs`
of its request. Deltas of one request come from two workers (prefill sends the
first token, decode the rest) and may cross: `RequestOutputs.chunks()` puts
them back in order, like `wire.push_pull.TokenStream` does for a
synchronous reader, and ends once the final delta and every token before it
have arrived. Deltas for a request nobody waits for (it was aborted) are dropped.

A request resumed elsewhere (its worker died, `router.migration`) keeps its
`RequestOutputs` under a new request id: `restart()` forgets what the failed
attempt sent beyond the tokens already handed out, and the new attempt's
output indices (which count from 0 again) are shifted past those tokens, so
the tokens come out as one stream and the text made of them
(`router.choice_output`) needs to know nothing of attempts.

With a cluster key, the socket admits only registered workers' sender keys
(`senders`, wire.socket_security), and a delta is taken only from a worker the
request's current attempt runs on (the `senders` it was opened with): a worker cannot
write into a stream it was not given. Others are refused (`wrong_sender`).

`RequestOutputs` is only the reorder buffer: what a request's attempts and
their workers are is the dispatcher's record (`router.dispatch.Generation`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

import zmq

from wire.codec import DecodeError, decode
from wire.requests import PhaseTimes, TokenDelta, TokenLogprob
from wire.socket_security import ClusterKey, bind_secured, process_key, refuse

logger = logging.getLogger("tandem.router")


class StreamFailed(RuntimeError):
    """The request's output will never complete (its worker died)."""


@dataclass
class OutputChunk:
    """Output tokens in order, continuing the previous chunk; `final` is set on the last one."""

    token_ids: list[int]
    logprobs: list[TokenLogprob] = field(default_factory=list)  # aligned with token_ids when asked for
    final: TokenDelta | None = None
    # Prompt tokens found cached, as the workers last said: what a final delta the router makes
    # itself (at a stop string, `router.choice_output`) reports.
    num_cached_tokens: int = 0
    # The prompt's logprobs (first entry None), on the chunk that first has them, when asked for.
    prompt_logprobs: tuple[TokenLogprob | None, ...] = ()
    # A `resumable` final delta: the attempt's worker gave the request up (the stream goes on once the
    # dispatcher starts another attempt and `restart()`s it).
    given_up: TokenDelta | None = None


class RequestOutputs:
    """One request's deltas, reassembled in output order, across the attempts of a resumed request.

    The queue has no bound of its own: it holds only this request's deltas (at
    most max_tokens + 1 per attempt, the worker's own output), and only while the
    request is open; the router admits at most `max_in_flight` of them."""

    def __init__(self):
        self._queue: asyncio.Queue[tuple[int, TokenDelta | StreamFailed]] = asyncio.Queue()
        self._tokens: dict[int, tuple[int, TokenLogprob | None]] = {}  # output index -> (token, logprob)
        self._next = 0  # output index of the next token to hand out
        self._final: TokenDelta | None = None
        self._attempt = 0  # items queued by an earlier attempt are dropped
        self._offset = 0  # tokens handed out before this attempt began: its index 0 is our `_offset`
        self._num_cached = 0  # the whole request's, from the latest delta that counted them
        self._prompt_logprobs: tuple[TokenLogprob | None, ...] = ()  # the first attempt's, until handed out
        self._prompt_logprobs_whole = False  # every piece of them arrived
        self._prompt_logprobs_taken = False
        self.delivered: list[int] = []  # every token id handed out, in order
        self.prompt_phases: PhaseTimes | None = None  # the current attempt's prefill worker's (router.phases)
        self.last_activity = time.monotonic()  # when a delta last arrived, or the attempt began
        self._given_up: TokenDelta | None = None  # the current attempt's, until handed out

    @property
    def attempt_tokens(self) -> int:
        """Tokens handed out by the current attempt (the first is the prefill worker's, the rest decode's)."""
        return self._next - self._offset

    def put(self, item: TokenDelta | StreamFailed) -> None:
        self.last_activity = time.monotonic()
        self._queue.put_nowait((self._attempt, item))

    def restart(self) -> int:
        """A new attempt continues after the tokens handed out so far (their count is returned)."""
        self._attempt += 1
        self._tokens.clear()
        self._final = self._given_up = self.prompt_phases = None
        self._offset = self._next
        self.last_activity = time.monotonic()
        return self._next

    async def chunks(self) -> AsyncIterator[OutputChunk]:
        """Yield what is ready, in order, each time deltas arrive; raises `StreamFailed`."""
        while True:
            self._add(*await self._queue.get())
            while not self._queue.empty():
                self._add(*self._queue.get_nowait())
            chunk = self._take_ready()
            if chunk.token_ids or chunk.final is not None or chunk.prompt_logprobs or chunk.given_up:
                yield chunk
            if chunk.final is not None:
                return

    def _add(self, attempt: int, item: TokenDelta | StreamFailed) -> None:
        if attempt != self._attempt:
            return  # from an attempt given up on: its tokens are computed again
        if isinstance(item, StreamFailed):
            raise item
        logprobs = item.logprobs or (None,) * len(item.token_ids)
        for i, (token, logprob) in enumerate(zip(item.token_ids, logprobs)):
            index = self._offset + item.first_index + i
            if index >= self._next:
                self._tokens.setdefault(index, (token, logprob))  # the first to arrive is the one shown
        if item.prompt_logprobs and not self._offset and not self._prompt_logprobs_whole:
            # Only a prompt no output was added to scores the request's own prompt.
            self._gather_prompt_logprobs(item)
        if item.phases is not None and not item.finished:  # the prefill worker's, with the first token
            self.prompt_phases = item.phases
        whole = item.shifted(self._offset)  # its counts as if the request had run in one piece
        if item.num_prompt_tokens:  # prefill's first-token delta counts nothing
            self._num_cached = whole.num_cached_tokens
        if item.finished and item.resumable:
            self._given_up = item
        elif item.finished:
            self._final = whole

    def _gather_prompt_logprobs(self, item: TokenDelta) -> None:
        """A piece of the prompt's logprobs (`TokenDelta.in_pieces`). One worker's pieces arrive in prompt order,
        the last with its tokens; a second worker's (decode computing the prompt again) overlap the first's,
        and an entry already held is kept (the first to arrive is the one shown)."""
        held = len(self._prompt_logprobs)
        if item.prompt_logprobs_from > held:
            return  # an earlier piece was lost (its sender's queue was full): these cannot be placed
        self._prompt_logprobs += item.prompt_logprobs[held - item.prompt_logprobs_from :]
        self._prompt_logprobs_whole = bool(item.token_ids)

    def _take_ready(self) -> OutputChunk:
        chunk = OutputChunk([], num_cached_tokens=self._num_cached)
        while self._next in self._tokens:
            token, logprob = self._tokens.pop(self._next)
            chunk.token_ids.append(token)
            if logprob is not None:
                chunk.logprobs.append(logprob)
            self._next += 1
        chunk.given_up, self._given_up = self._given_up, None
        if self._prompt_logprobs_whole and not self._prompt_logprobs_taken:
            chunk.prompt_logprobs, self._prompt_logprobs_taken = self._prompt_logprobs, True
        self.delivered += chunk.token_ids
        if self._final is not None and self._next >= self._final.num_output_tokens:
            chunk.final = self._final
        return chunk


class TokenStreamConsumer:
    """Bound on `start()` (on the router's loop); `open(request_id)` before the request is sent anywhere.

    `key`: the cluster key of the router's sockets (None: the process's, if any; see
    `wire.socket_security`). `senders`: a registered worker's name from the public key its deltas
    carry (None: unknown); with a key, only those workers connect, and each delta's sender is checked.
    Undecodable or wrong-type messages are refused and counted."""

    def __init__(self, address: str = "tcp://127.0.0.1:0", key: ClusterKey | None = None,
                 senders: Callable[[str], str | None] = lambda public_key: None):  # fmt: skip
        self._bind_address, self._key, self._senders = address, key or process_key(), senders
        self.address = ""
        self._requests: dict[str, tuple[RequestOutputs, frozenset[str] | None]] = {}  # by attempt id
        self._sock: zmq.Socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        self._sock = zmq.Context.instance().socket(zmq.PULL)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.RCVHWM, 0)  # never drop a delta: a slow router queues them (see `RequestOutputs`)
        self.address = bind_secured(self._sock, self._bind_address, "token_stream", key=self._key,
                                    senders=self._senders)  # fmt: skip
        # Read straight off the socket's FD: every delta waiting is taken in one wake-up, without the
        # future per message that zmq.asyncio makes (two deltas per request add up at thousands a second).
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._sock.FD, self._read)
        self._loop.call_soon(self._read)  # ZMQ's FD signals changes: read what came before

    def open(self, request_id: str, outputs: RequestOutputs | None = None,
             senders: frozenset[str] | None = None) -> RequestOutputs:  # fmt: skip
        """Route `request_id`'s deltas to `outputs` (a new one unless a resumed request brings its own), taken
        only from the workers named in `senders` (None: any admitted sender)."""
        outputs = outputs or RequestOutputs()
        self._requests[request_id] = (outputs, senders)
        return outputs

    def close_request(self, request_id: str) -> None:
        self._requests.pop(request_id, None)

    def _read(self) -> None:
        while self._sock is not None:
            try:
                frame = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)[0]  # a delta is one frame
            except zmq.Again:
                return
            try:
                delta = decode(frame.bytes, TokenDelta)
            except DecodeError as err:
                refuse("token_stream", err.reason, err)
                continue
            route = self._requests.get(delta.request_id)
            if route is None:
                continue
            outputs, senders = route
            # The registered worker that sent it (None: the socket authenticates nobody).
            sender = None if self._key is None else self._senders(frame.get("User-Id")) or "an unregistered worker"
            if senders is not None and sender is not None and sender not in senders:
                refuse("token_stream", "wrong_sender", f"{sender} sent a delta of {delta.request_id}")
                continue
            outputs.put(delta)

    async def close(self) -> None:
        if self._sock is not None:
            self._loop.remove_reader(self._sock.FD)
            self._sock.close(linger=0)
            self._sock = None
