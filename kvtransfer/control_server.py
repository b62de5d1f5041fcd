"""A worker's control socket: the router's `reserve` / `prefill` / `abort` / `load` calls over ZMQ.

    router DEALER ── ControlCall ──► ROUTER ── server thread ── submit(fn) ──► worker's step loop
    router DEALER ◄── ControlReply ── ROUTER ◄── server thread ◄── pipe ◄── fn's result (done callback)

One thread owns the ROUTER socket. It decodes each call, turns it into a
function of the worker with the worker's call table (`Calls`), and hands that
to the worker's step loop (`StepLoop.submit`, as the Ray actor methods do), so
calls of many requests are in flight at once; replies come back through a
queue, the step loop waking this thread with a byte on a pipe. A malformed or
unknown message never reaches the worker: it is answered with a rejection when
it carries a call id, else dropped; both are counted (`rejected`, `dropped`).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from concurrent.futures import Future
from typing import Callable, Mapping

import zmq

from kvtransfer.codec import DecodeError, decode, encode
from kvtransfer.control_sockets import MAX_CONTROL_MESSAGE_BYTES, control_socket
from kvtransfer.protocol import ControlCall, ControlReply
from kvtransfer.socket_security import bind_secured, refuse

logger = logging.getLogger("tandem.kvtransfer")

# method -> payload -> the function of the worker to run on its step loop (returns the reply payload).
# Decoding the payload happens in the first call, on the server thread: a bad one raises ValueError there.
Calls = Mapping[str, Callable[[object], Callable[[object], object]]]


def _abort(request_id):
    if not isinstance(request_id, str):
        raise ValueError(f"abort takes a request id, got {type(request_id).__name__}")
    return lambda worker: worker.abort(request_id)


def _load(_):
    return lambda worker: encode(worker.load())


COMMON_CALLS: Calls = {"abort": _abort, "load": _load}


class ControlServer:
    """Serves `calls` on a ROUTER bound at `address` ("tcp://host:0" picks a port; see `address`).

    Ownership: the caller owns the step loop behind `submit` and must `close()` this server first."""

    def __init__(self, submit: Callable[[Callable], Future], calls: Calls, address: str = "tcp://127.0.0.1:0",
                 max_message_bytes: int = MAX_CONTROL_MESSAGE_BYTES):  # fmt: skip
        self._submit, self._calls = submit, calls
        self._sock = control_socket(zmq.Context.instance(), zmq.ROUTER)
        # This process's cluster key (TANDEM_CLUSTER_KEY), if any: only routers holding it get through.
        self.address = bind_secured(self._sock, address, "control", max_message_bytes)
        self._replies: queue.SimpleQueue = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.dropped = self.rejected = 0
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="control-server", daemon=True)
        self._thread.start()

    def close(self, timeout_s: float = 5.0) -> None:
        self._stopped = True
        self._wake()
        self._thread.join(timeout_s)

    # ---- the server thread ------------------------------------------------
    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        try:
            while not self._stopped:
                events = dict(poller.poll())
                if self._sock in events:
                    self._take_calls()
                if self._wake_r in events:
                    self._drain_wake_pipe()
                self._send_replies()
        finally:
            self._sock.close()
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _take_calls(self) -> None:
        while True:
            try:
                parts = self._sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._take(parts)

    def _take(self, parts: list[bytes]) -> None:
        if len(parts) != 2:
            self._drop(f"{len(parts) - 1} frames instead of 1")
            return
        identity, frame = parts
        try:
            call = decode(frame, ControlCall)
        except DecodeError as e:
            self._drop(str(e))
            return
        try:
            fn = self._prepare(call)
            done = self._submit(fn)
        except ValueError as e:  # DecodeError is one: the call's fault
            self.rejected += 1
            self._send(identity, ControlReply(call.call_id, error=f"{type(e).__name__}: {e}", rejected=True))
            return
        except Exception as e:  # the step loop is stopped: the worker is going away
            self._send(identity, ControlReply(call.call_id, error=f"{type(e).__name__}: {e}"))
            return
        done.add_done_callback(lambda f: self._on_done(identity, call.call_id, f))

    def _prepare(self, call: ControlCall) -> Callable:
        prepare = self._calls.get(call.method)
        if prepare is None:
            raise ValueError(f"unknown method {call.method!r}")
        return prepare(call.payload)

    def _drop(self, why: str) -> None:
        self.dropped += 1
        refuse("control", "malformed", why)
        logger.warning("control server %s dropped a message: %s", self.address, why)

    def _on_done(self, identity: bytes, call_id: int, done: Future) -> None:
        """On the step loop's thread: queue the reply and wake the server thread."""
        error = done.exception()
        if error is None:
            reply = ControlReply(call_id, done.result())
        else:
            reply = ControlReply(call_id, error=f"{type(error).__name__}: {error}", rejected=isinstance(error, ValueError))
        self._replies.put((identity, reply))
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except (BlockingIOError, OSError):
            pass  # the pipe is full (a wake-up is pending anyway) or closed (stopped)

    def _drain_wake_pipe(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _send_replies(self) -> None:
        while True:
            try:
                identity, reply = self._replies.get_nowait()
            except queue.Empty:
                return
            self._send(identity, reply)

    def _send(self, identity: bytes, reply: ControlReply) -> None:
        try:
            frame = encode(reply)
        except TypeError as e:  # a worker method returned something that is not a payload: a bug, say so
            frame = encode(ControlReply(reply.call_id, error=f"unencodable reply: {e}"))
        try:
            self._sock.send_multipart([identity, frame], zmq.NOBLOCK)
        except zmq.ZMQError as e:  # the router that called is gone (ROUTER_MANDATORY): nobody waits
            logger.warning("control server %s: reply to a gone router dropped: %s", self.address, e)


class ControlServed:
    """Mixin for a worker's Ray actor (an `engine.step_loop.LoopedActor`): its worker's calls are also served
    on a `ControlServer`, started once the worker is built; `control_address()` says where."""

    control_calls: Calls = COMMON_CALLS
    control: ControlServer | None = None

    def control_bind_address(self) -> str:
        """Where to bind (port 0: any free one); actors whose router is on another node bind the node's address."""
        return "tcp://127.0.0.1:0"

    def on_started(self) -> None:
        self.control = ControlServer(self.loop.submit, self.control_calls, self.control_bind_address())

    def on_stopping(self) -> None:
        if self.control is not None:
            self.control.close()

    def control_address(self) -> str:
        return self.control.address
