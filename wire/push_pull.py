"""ZMQ PUSH/PULL for small typed messages: token deltas to the router, first tokens to a decode inbox.

Each message is one `wire` message in the one codec (never pickle). A
`Pushers` holds one PUSH per destination address and belongs to the thread
that drives its worker; a `PullSocket` is bound by its reader. `TokenStream`
is a synchronous consumer for scripts and tests (the router's own is
`router.token_stream`): it reassembles each request's tokens from deltas that
may come from two workers, in any order.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

import zmq

from wire.codec import DecodeError, decode, encode
from wire.requests import TokenDelta
from wire.socket_security import bind_secured, connect_secured, refuse, sender_keypair

logger = logging.getLogger("tandem.wire")


class Pushers:
    """One connected PUSH socket per destination; sends never block the step loop.

    A destination takes one kind of message: token deltas (the router's stream, signed with this
    process's sender key) or a peer's messages (with the cluster key). Sockets to destinations that
    are gone do not pile up: one whose queue is full (its reader dead or stuck) is closed, dropping what
    it queued, and at most `max_destinations` stay open, the least recently used closed first (a decode
    worker that restarts binds a new inbox each time). `signed`: every message goes with this process's
    own key, as token deltas always do (the rank links: each side admits only the other's key)."""

    def __init__(self, send_hwm: int = 100_000, max_destinations: int = 64, signed: bool = False):
        self._ctx = zmq.Context.instance()
        self._socks: OrderedDict[str, zmq.Socket] = OrderedDict()
        self._send_hwm, self._max_destinations, self._signed = send_hwm, max_destinations, signed

    def send(self, address: str, msg) -> bool:
        """Queue `msg` for `address`; False (logged) when its queue is full: the reader is gone or stuck."""
        sock = self._socket(address, msg)
        try:
            sock.send(encode(msg), zmq.NOBLOCK)
            return True
        except zmq.Again:
            logger.error("dropped a %s for %s: its queue is full (its socket closed)", type(msg).__name__, address)
            self._socks.pop(address).close(linger=0)
            return False

    @property
    def destinations(self) -> tuple[str, ...]:
        """The addresses with an open socket, least recently used first."""
        return tuple(self._socks)

    def _socket(self, address: str, msg) -> zmq.Socket:
        sock = self._socks.get(address)
        if sock is not None:
            self._socks.move_to_end(address)
            return sock
        if len(self._socks) >= self._max_destinations:
            self._socks.popitem(last=False)[1].close()  # the least recently used: it still flushes (LINGER)
        sock = self._socks[address] = self._ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 1000)  # a worker shutting down still flushes its last deltas
        sock.setsockopt(zmq.SNDHWM, self._send_hwm)
        # The router takes a request's deltas only from its workers: they go with this process's own key.
        signed = self._signed or isinstance(msg, TokenDelta)
        connect_secured(sock, address, sender=sender_keypair() if signed else None)
        return sock

    def close(self) -> None:
        for sock in self._socks.values():
            sock.close()
        self._socks.clear()


class PullSocket:
    """A bound PULL that decodes only the `expected` message types; anything else is refused (counted) and dropped.

    Bounded: ZMQ's default receive high-water mark (1000 messages, each at most
    `SMALL_MESSAGE_BYTES`); past it the senders' `Pushers` queue on their side up
    to their own bound. `kind` names the socket in the refusal counters; `senders`, as `bind_secured`
    takes it: only those senders' own keys are admitted, not the cluster key."""

    def __init__(self, expected: tuple[type, ...], address: str = "tcp://127.0.0.1:0", kind: str = "inbox",
                 senders: Callable[[str], str | None] | None = None):  # fmt: skip
        self.expected, self.kind = expected, kind
        self._sock = zmq.Context.instance().socket(zmq.PULL)
        self._sock.setsockopt(zmq.LINGER, 0)
        self.address = bind_secured(self._sock, address, kind, senders=senders)

    @property
    def socket(self) -> zmq.Socket:
        """For a poller that waits on it beside others (then `poll(0)` reads what came)."""
        return self._sock

    def poll(self, timeout_ms: int = 0, max_messages: int = 1024) -> list:
        out = []
        if not self._sock.poll(timeout_ms):
            return out
        while len(out) < max_messages:
            try:
                data = self._sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            try:
                out.append(decode(data, self.expected))
            except DecodeError as e:
                refuse(self.kind, e.reason, e)
        return out

    def close(self) -> None:
        self._sock.close(linger=0)


@dataclass
class StreamedRequest:
    """One request's output as the consumer has it so far."""

    tokens: dict[int, int] = field(default_factory=dict)  # output index -> token id
    final: TokenDelta | None = None

    @property
    def token_ids(self) -> list[int]:
        return [self.tokens[i] for i in range(len(self.tokens))]

    @property
    def finished(self) -> bool:
        # The final delta may overtake earlier ones from another worker: done once nothing is missing.
        return self.final is not None and len(self.tokens) >= self.final.num_output_tokens


class TokenStream:
    """Binds a PULL for TokenDeltas; `poll` folds them into per-request `StreamedRequest`s.

    For processes without a cluster key (scripts, tests): with one, it would admit the cluster key,
    and workers send their deltas with their own sender keys, which only the router registers
    (`router.token_stream`)."""

    def __init__(self, address: str = "tcp://127.0.0.1:0"):
        self._pull = PullSocket((TokenDelta,), address, kind="token_stream")
        self.address = self._pull.address
        self.requests: dict[str, StreamedRequest] = {}

    def poll(self, timeout_ms: int = 0) -> list[TokenDelta]:
        deltas = self._pull.poll(timeout_ms)
        for delta in deltas:
            req = self.requests.setdefault(delta.request_id, StreamedRequest())
            for i, token in enumerate(delta.token_ids):
                req.tokens[delta.first_index + i] = token
            if delta.finished:
                req.final = delta
        return deltas

    def finished(self, request_id: str) -> bool:
        req = self.requests.get(request_id)
        return req is not None and req.finished

    def close(self) -> None:
        self._pull.close()
