"""The router's side of a worker's control socket: one DEALER per worker on the router's event loop.

`control_endpoint(address)` is a worker as the router sees it: typed async
`reserve`, `prefill`, `abort` and `load` (a `ControlEndpoint`), the one way a
request reaches a worker. Many calls are in flight on one socket; replies come
in any order and are matched by call id.

The connection, as the socket monitor tells it (a disconnect is not a death:
ZMQ reconnects, and only the registry's `wire.liveness` judges a worker):
  - before the first handshake, calls wait for it (a worker just registered);
  - up (handshake succeeded): calls go through;
  - dropped (the peer closed, or the ZMTP heartbeat timed out): the calls in flight fail with
    `WorkerGone` (their replies are lost), and the socket is made anew, so that no message
    queued for the old connection reaches the worker later, when nobody waits for its reply;
  - down: new calls fail at once with `WorkerGone`, `refused` set when the worker's address
    refuses connections (nobody listens: its process is gone), while ZMQ keeps reconnecting;
  - up again (a handshake on the new connection): calls go through again, and the aborts that failed
    while it was down are sent (`ControlEndpoint`: an abort is idempotent, so one the worker did get
    before the drop is harmless twice; without this a lost abort leaves the request generating for
    nobody and holding its KV, since the router's calls keep the worker's router lease alive).

Failures, as the registry's `GuardedEndpoint` sorts them:
  - the worker answers that the call itself was bad: `CallRejected` (a ValueError: the request's fault);
  - the worker's method raised: `CallFailed`;
  - no reply within `timeout_s`: `CallTimedOut`, a backstop for that one call only (a long step
    delays replies; whether the worker is alive is the heartbeats' business);
  - the connection is down or dropped: `WorkerGone`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Callable

import zmq
from zmq.utils.monitor import parse_monitor_message

from wire.codec import DecodeError, decode, encode
from wire.control_sockets import MAX_CONTROL_MESSAGE_BYTES, control_socket
from wire.control import CallPayload, ControlCall, ControlReply, ReplyPayload
from router.handoff import HandoffError
from wire.requests import DecodeReservation, GenerateRequest, PrefillTask, ReserveRefused, WorkerLoad
from wire.socket_security import ClusterKey, connect_secured, open_monitor, sender_keypair

logger = logging.getLogger("tandem.router")

# Aborts kept per worker while its control connection is down. While it is down no new request reaches the
# worker, so the aborts that matter are for what it held at the drop: at most the router's max_in_flight
# requests (256 by default), far below this. Past it the oldest are dropped (logged); their requests end
# on their own (max_tokens, a transfer deadline, or the worker's router lease if the router goes too).
MAX_UNDELIVERED_ABORTS = 4096

# Only a backstop for one call that never gets its reply; it marks nothing dead. Generous, because a
# prefill or reserve call may wait behind a worker's current step, and CPU steps take 10-30 s.
DEFAULT_CALL_TIMEOUT_S = 120.0

_EVENTS = zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED


class CallRejected(ValueError):
    """The worker refused the call as malformed (the request's fault, not the worker's)."""


class CallFailed(RuntimeError):
    """The worker's method raised."""


class CallTimedOut(TimeoutError):
    """No reply within the call's timeout."""


class WorkerGone(ConnectionError):
    """The control connection is down (or this client closed): the call was not made, or its reply is lost.

    `refused`: the worker's address refuses connections (nobody listens there), so its process is likely
    gone; False: the connection dropped or is being retried (the worker may be back soon)."""

    def __init__(self, message: str, refused: bool = False):
        super().__init__(message)
        self.refused = refused


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
        self.up = False  # handshake done and no disconnect since
        self.was_up = False  # connected once: from then on a down connection fails calls at once
        self.refused = False  # the last connection attempt was refused
        self.closed_reason = ""  # set by close(): every call fails
        self.reconnects = 0
        self.on_reconnect: Callable[[], None] = lambda: None  # called on the loop when the connection is back
        self.late_replies = self.dropped = 0  # replies after their call ended; frames that were no reply

    async def call(self, method: str, payload: CallPayload) -> ReplyPayload:
        """Send one call and wait for its reply payload (raises as the module docstring says)."""
        if self.closed_reason:
            raise WorkerGone(self.closed_reason)
        if self._sock is None:
            self._loop = asyncio.get_running_loop()
            self._open()
        self._read_monitor()  # a disconnect not yet read must be known before anything is sent
        if self.was_up and not self.up:
            down = (f"the worker at {self.address} refuses connections (its process is gone?)" if self.refused
                    else f"the control connection to {self.address} is down (reconnecting)")  # fmt: skip
            raise WorkerGone(down, refused=self.refused)
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
        self.closed_reason = self.closed_reason or f"control client of {self.address} closed"
        self._fail_all(WorkerGone(self.closed_reason))
        self._close_sockets()

    # ---- the socket -------------------------------------------------------
    def _open(self) -> None:
        self._sock = control_socket(zmq.Context.instance(), zmq.DEALER)
        self._monitor = open_monitor(self._sock, _EVENTS)
        # Only the router calls workers and syncs with the controller: both admit its own key, not the cluster's.
        connect_secured(self._sock, self.address, MAX_CONTROL_MESSAGE_BYTES, key=self.key, sender=sender_keypair())
        self._loop.add_reader(self._sock.FD, self._read_replies)
        self._loop.add_reader(self._monitor.FD, self._read_monitor)
        self._loop.call_soon(self._read_monitor)  # ZMQ's FD signals changes: read what came before

    def _close_sockets(self) -> None:
        for sock in (self._sock, self._monitor):
            if sock is not None:
                self._loop.remove_reader(sock.FD)
        if self._sock is not None:
            self._sock.disable_monitor()
            self._sock.close()  # LINGER 0: whatever was queued for the worker is dropped, never delivered
        if self._monitor is not None:
            self._monitor.close()
        self._sock = self._monitor = None

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

    # ---- the connection -----------------------------------------------------
    def _read_monitor(self) -> None:
        while self._monitor is not None:
            try:
                event = parse_monitor_message(self._monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
            self._on_event(event["event"])

    def _on_event(self, event: int) -> None:
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            back = self.was_up
            self.up, self.was_up, self.refused = True, True, False
            if back:
                self.reconnects += 1
                logger.info("control connection to %s is back", self.address)
                self.on_reconnect()
        elif event == zmq.EVENT_CONNECTED:
            self.refused = False  # someone listens (the handshake is still to come)
        elif event == zmq.EVENT_CONNECT_RETRIED:
            self.refused = True
        elif event == zmq.EVENT_DISCONNECTED:
            self._dropped()

    def _dropped(self) -> None:
        """The connection broke: calls in flight lose their replies; a fresh socket reconnects."""
        if self.up:
            logger.warning("control connection to %s dropped; reconnecting", self.address)
        self.up = False
        self._fail_all(WorkerGone(f"the control connection to {self.address} dropped: the reply is lost"))
        # The old socket may still hold calls not yet written to the wire; ZMQ would deliver them after
        # reconnecting, to a worker whose replies nobody awaits (a reserve would leak its blocks).
        self._close_sockets()
        self._open()

    def _fail_all(self, error: Exception) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)


class ControlEndpoint:
    """A worker as the router calls it; owns its `ControlClient` (`close()` on the client's event loop) and the
    aborts that could not reach the worker while the connection was down, sent again once it is back."""

    def __init__(self, client: ControlClient):
        self.client = client
        self.undelivered_aborts: dict[str, None] = {}  # request ids, oldest first (a dict as an ordered set)
        self.dropped_aborts = 0  # aborts given up past MAX_UNDELIVERED_ABORTS
        self._redelivery: asyncio.Task | None = None
        client.on_reconnect = self._redeliver_aborts

    def close(self) -> None:
        """Release the socket; idempotent. Later calls fail with `WorkerGone`. The aborts still kept are dropped:
        the worker left the registry (unregistered, as the controller does to a dead one, or replaced by a new
        incarnation of its name), and nothing of this router's runs there any more."""
        self.undelivered_aborts.clear()
        if self._redelivery is not None:
            self._redelivery.cancel()
        self.client.close()

    async def reserve(self, request: GenerateRequest) -> DecodeReservation | ReserveRefused:
        return self._expect(await self.client.call("reserve", request), (DecodeReservation, ReserveRefused))

    async def prefill(self, task: PrefillTask) -> None:
        """Returns once the worker queued it; `HandoffError` (retryable: 503) when it refused it as busy."""
        refused = self._expect(await self.client.call("prefill", task), (ReserveRefused, type(None)))
        if refused is not None:
            raise HandoffError(f"prefill refused request {refused.request_id}: {refused.reason}", retryable=True)

    async def abort(self, request_id: str) -> None:
        """Raises like any call; when the connection is down (`WorkerGone`) the abort is also kept and sent
        again once it is back."""
        try:
            await self.client.call("abort", request_id)
        except WorkerGone:
            self._keep_undelivered(request_id)
            raise

    def _keep_undelivered(self, request_id: str) -> None:
        if self.client.closed_reason:  # closed: the worker is no longer ours to free
            return
        self.undelivered_aborts[request_id] = None
        if len(self.undelivered_aborts) > MAX_UNDELIVERED_ABORTS:
            oldest = next(iter(self.undelivered_aborts))
            del self.undelivered_aborts[oldest]
            self.dropped_aborts += 1
            logger.warning("more than %d aborts wait for %s: %s dropped", MAX_UNDELIVERED_ABORTS,
                           self.client.address, oldest)  # fmt: skip

    def _redeliver_aborts(self) -> None:
        """The connection is back: send the kept aborts (one task at a time; it runs until none is left)."""
        if self.undelivered_aborts and (self._redelivery is None or self._redelivery.done()):
            self._redelivery = asyncio.get_running_loop().create_task(self._send_undelivered())

    async def _send_undelivered(self) -> None:
        # An abort that fails again with the connection down is kept again (by `abort`) for the next time
        # it is back; any other failure means the worker got it (or never will: a timeout is its backstop).
        while self.undelivered_aborts and self.client.up:
            request_ids = list(self.undelivered_aborts)
            self.undelivered_aborts.clear()
            await asyncio.gather(*(self.abort(r) for r in request_ids), return_exceptions=True)
            logger.info("sent %d aborts kept while the connection to %s was down", len(request_ids),
                        self.client.address)  # fmt: skip

    async def load(self) -> WorkerLoad:
        return self._expect(await self.client.call("load", None), WorkerLoad)

    def _expect(self, payload: ReplyPayload, kind):
        if not isinstance(payload, kind):  # the worker answered another call's kind of reply: its bug
            raise CallFailed(f"{self.client.address} answered {type(payload).__name__}")
        return payload


def control_endpoint(address: str, timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
                     key: ClusterKey | None = None) -> ControlEndpoint:  # fmt: skip
    """A worker's endpoint over its control socket at `address`, presenting `key` (None: this process's)."""
    return ControlEndpoint(ControlClient(address, timeout_s, key))
