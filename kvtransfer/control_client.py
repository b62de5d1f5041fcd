"""The router's side of a worker's control socket: one DEALER per worker on the router's event loop.

`control_endpoint(address)` is the same async endpoint as `AsyncEncodedCalls`
over Ray (`reserve`, `prefill`, `abort`, `load`), so the handoff, the registry
and the dispatcher do not know which one they hold. Many calls are in flight
on one socket; replies come in any order and are matched by call id.

Failures, as the registry's `GuardedEndpoint` sorts them:
  - the worker answers that the call itself was bad: `CallRejected` (a ValueError: the worker stays);
  - the worker's method raised: `CallFailed`;
  - no reply within `timeout_s`: `CallTimedOut`;
  - the worker's process closed its end (died, was killed): `WorkerGone`, for the calls waiting and every
    later one, at once.
"""

from __future__ import annotations

import asyncio
import itertools
import logging

import zmq
from zmq.utils.monitor import parse_monitor_message

from kvtransfer.codec import DecodeError, decode, encode
from kvtransfer.control_sockets import MAX_CONTROL_MESSAGE_BYTES, control_socket
from kvtransfer.handoff import AsyncEncodedCalls
from kvtransfer.protocol import ControlCall, ControlReply
from kvtransfer.socket_security import ClusterKey, connect_secured

logger = logging.getLogger("tandem.kvtransfer")

DEFAULT_CALL_TIMEOUT_S = 30.0  # a prefill call waits for the worker's current step; CPU steps can be long


class CallRejected(ValueError):
    """The worker refused the call as malformed (the request's fault, not the worker's)."""


class CallFailed(RuntimeError):
    """The worker's method raised."""


class CallTimedOut(TimeoutError):
    """No reply in time: the worker is hung or gone."""


class WorkerGone(ConnectionError):
    """The worker's end of the control connection closed."""


class ControlClient:
    """Calls to one worker's `ControlServer`. Bound to the event loop of its first call; `close()` on that loop."""

    def __init__(self, address: str, timeout_s: float = DEFAULT_CALL_TIMEOUT_S, key: ClusterKey | None = None):
        self.address, self.timeout_s = address, timeout_s
        self.key = key  # the cluster key the worker's socket demands (None: this process's, if any)
        self._sock: zmq.Socket | None = None
        self._monitor: zmq.Socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._call_ids = itertools.count()
        self.gone_reason = ""
        self.late_replies = self.dropped = 0  # replies after their call ended; frames that were no reply

    async def call(self, method: str, payload: bytes | str | None) -> bytes | str | None:
        """Send one call and wait for its reply payload (raises as the module docstring says)."""
        if self.gone_reason:
            raise WorkerGone(self.gone_reason)
        if self._sock is None:
            self._connect()
        call_id = next(self._call_ids)
        reply = self._pending[call_id] = self._loop.create_future()
        timer = self._loop.call_later(self.timeout_s, self._expire, call_id, method)
        try:
            self._sock.send(encode(ControlCall(call_id, method, payload)), zmq.NOBLOCK)
            if self._sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:  # the send may have eaten the FD's edge
                self._loop.call_soon(self._read_replies)
            return await reply
        finally:
            timer.cancel()
            self._pending.pop(call_id, None)

    def close(self) -> None:
        self._fail_all(WorkerGone(f"control client of {self.address} closed"))
        self.gone_reason = self.gone_reason or "closed"
        for sock in (self._sock, self._monitor):
            if sock is not None:
                self._loop.remove_reader(sock.FD)
                sock.close()
        self._sock = self._monitor = None

    def _connect(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._sock = control_socket(zmq.Context.instance(), zmq.DEALER)
        self._monitor = self._sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        connect_secured(self._sock, self.address, MAX_CONTROL_MESSAGE_BYTES, key=self.key)
        self._loop.add_reader(self._sock.FD, self._read_replies)
        self._loop.add_reader(self._monitor.FD, self._read_monitor)
        self._loop.call_soon(self._read_monitor)  # ZMQ's FD signals changes: read what came before

    def _read_replies(self) -> None:
        while self._sock is not None:
            try:
                frame = self._sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                reply = decode(frame, ControlReply)
            except DecodeError as e:
                self.dropped += 1
                logger.warning("control client of %s dropped a frame: %s", self.address, e)
                continue
            self._settle(reply)

    def _settle(self, reply: ControlReply) -> None:
        future = self._pending.get(reply.call_id)
        if future is None or future.done():
            self.late_replies += 1
        elif reply.rejected:
            future.set_exception(CallRejected(reply.error))
        elif reply.error:
            future.set_exception(CallFailed(reply.error))
        else:
            future.set_result(reply.payload)

    def _expire(self, call_id: int, method: str) -> None:
        future = self._pending.get(call_id)
        if future is not None and not future.done():
            future.set_exception(CallTimedOut(f"{method} to {self.address}: no reply within {self.timeout_s:g} s"))

    def _read_monitor(self) -> None:
        while self._monitor is not None:
            try:
                event = parse_monitor_message(self._monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
            if event["event"] == zmq.EVENT_DISCONNECTED:
                self.gone_reason = f"worker at {self.address} closed its control connection"
                self._fail_all(WorkerGone(self.gone_reason))

    def _fail_all(self, error: Exception) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)


def control_endpoint(address: str, timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
                     key: ClusterKey | None = None) -> AsyncEncodedCalls:  # fmt: skip
    """A worker's async endpoint (`reserve` / `prefill` / `abort` / `load`) over its control socket at `address`."""
    client = ControlClient(address, timeout_s, key)
    return AsyncEncodedCalls(client.call, client.close)
