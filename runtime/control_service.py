"""A worker's control socket, served on its I/O thread: the router's calls.

    router DEALER ── ControlCall ──► ROUTER (I/O thread)
                                       load   → answered here, from the LoadBoard (never waits for a step)
                                       others → decoded, handed to the loop as a `Call`
    router DEALER ◄── ControlReply ── ROUTER ◄── SendReply command ◄── call.answer(...) on the loop

The loop answers each `Call` exactly once, when it has the answer (a decode
reservation of a tensor-parallel worker waits for its ranks' acks); the reply
goes out through this thread after every command the loop posted before it, so
whatever the answer promises (a KV reservation) already exists on this thread.
A malformed or unknown call never reaches the loop: it is answered as rejected
when it carries a call id, else dropped; both are counted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Mapping

import zmq

from wire.codec import DecodeError, encode
from wire.control_sockets import MAX_CONTROL_MESSAGE_BYTES, control_socket
from wire.control import ControlReply, ReplyPayload, read_call
from wire.socket_security import bind_secured, only, refuse
from runtime.io_thread import IOService
from runtime.load_board import LoadBoard

logger = logging.getLogger("tandem.runtime")

# method -> its payload decoded for the loop (raises ValueError: the call's fault, answered as rejected).
Decoders = Mapping[str, Callable[[object], object]]


@dataclass(frozen=True)
class Call:
    """One call for the worker's loop: `answer(result)` or `answer(None, error)` exactly once, from the loop.

    `result` is a protocol message, a string, or None; an `error` that is a ValueError tells the caller
    the call itself was bad (the worker is fine)."""

    method: str
    arg: object
    answer: Callable[..., None]


@dataclass(frozen=True)
class SendReply:
    """Command for the I/O thread: send `reply` to the router peer `identity`."""

    identity: bytes
    reply: ControlReply


def payload_of(kind: type) -> Callable[[object], object]:
    """A decoder for calls whose payload must be a `kind` (a message type, or str for a request id)."""

    def check(payload):
        if not isinstance(payload, kind):
            raise ValueError(f"expected {kind.__name__}, got {type(payload).__name__}")
        return payload

    return check


request_id_arg = payload_of(str)


class ControlService(IOService):
    """The ROUTER at `address` ("tcp://host:0" picks a port; `address` says which), CURVE-secured
    when this process has a cluster key: then it admits only `router_key` (the router's sender key,
    public half), since a call can reserve, free, and point the worker's pushes at any address."""

    def __init__(self, board: LoadBoard, decoders: Decoders, deliver: Callable[[Call], None],
                 post: Callable[[object], None], address: str = "tcp://127.0.0.1:0",
                 max_message_bytes: int = MAX_CONTROL_MESSAGE_BYTES, router_key: str = ""):  # fmt: skip
        self.board, self._decoders, self._deliver, self._post = board, decoders, deliver, post
        self._sock = control_socket(zmq.Context.instance(), zmq.ROUTER)
        self.address = bind_secured(self._sock, address, "control", max_message_bytes,
                                    senders=only(router_key, "router"))  # fmt: skip
        self.dropped = self.rejected = 0

    # ---- IOService ------------------------------------------------------------
    def commands(self) -> dict[type, Callable]:
        return {SendReply: lambda cmd: self._send(cmd.identity, cmd.reply)}

    def sockets(self) -> list:
        return [self._sock]

    def service(self) -> None:
        while True:
            try:
                parts = self._sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._take(parts)

    def close(self) -> None:
        self._sock.close(linger=0)

    # ---- calls ----------------------------------------------------------------
    def _take(self, parts: list[bytes]) -> None:
        try:
            identity, call = read_call(parts)
        except DecodeError as e:
            return self._drop(str(e))
        self.board.router_seen()
        if call.method == "load":
            return self._send(identity, ControlReply(call.call_id, self.board.heartbeat()))
        try:
            arg = self._decoder(call.method)(call.payload)
        except ValueError as e:  # DecodeError is one: the call's fault
            self.rejected += 1
            return self._send(identity, ControlReply(call.call_id, error=f"{type(e).__name__}: {e}", rejected=True))
        answer = self._answerer(identity, call.call_id)
        try:
            self._deliver(Call(call.method, arg, answer))
        except RuntimeError as e:  # the loop is stopped: the worker is going away
            answer(None, e)

    def _decoder(self, method: str) -> Callable[[object], object]:
        decoder = self._decoders.get(method)
        if decoder is None:
            raise ValueError(f"unknown method {method!r}")
        return decoder

    def _answerer(self, identity: bytes, call_id: int) -> Callable[..., None]:
        def answer(result=None, error: BaseException | None = None) -> None:
            if error is None and not isinstance(result, ReplyPayload):  # a bug in the loop: say so
                reply = ControlReply(call_id, error=f"unencodable reply: {type(result).__name__}")
            elif error is None:
                reply = ControlReply(call_id, result)
            else:
                reply = ControlReply(call_id, error=f"{type(error).__name__}: {error}",
                                     rejected=isinstance(error, ValueError))  # fmt: skip
            self._post(SendReply(identity, reply))

        return answer

    def _drop(self, why: str) -> None:
        self.dropped += 1
        refuse("control", "malformed", why)
        logger.warning("control socket %s dropped a message: %s", self.address, why)

    def _send(self, identity: bytes, reply: ControlReply) -> None:
        try:
            self._sock.send_multipart([identity, encode(reply)], zmq.NOBLOCK)
        except zmq.ZMQError as e:  # the router that called is gone (ROUTER_MANDATORY): nobody waits
            logger.warning("control socket %s: reply to a gone router dropped: %s", self.address, e)
