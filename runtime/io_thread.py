"""A worker's I/O thread: one poller over every socket of its services, plus its command mailbox.

    services   each owns some sockets (the control ROUTER, a KV receiver's ROUTER, a KV
               sender's DEALERs, a follower's rank-link PULL) and says when it next has timer
               work (heartbeats, leases, deadlines)
    commands   typed messages from the worker's loop thread (start a transfer, send a layer,
               release a request's blocks, a reply to send), run here in the order posted

One round: wait (blocking) until a socket is readable, a command arrives or the
nearest deadline passes; run the commands; let every service read and tick.
Because this thread never runs a forward step, heartbeats, leases and the
router's `load` calls are answered within milliseconds however long a step takes.
Nothing here may block either: a service that would wait for a peer keeps the
wait as state and looks again next round.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from typing import Callable, Sequence

import zmq

from runtime.mailbox import STOP, Mailbox

logger = logging.getLogger("tandem.runtime")


class IOService:
    """One service of the I/O thread (the control socket, a KV service, a follower's rank link)."""

    def commands(self) -> dict[type, Callable]:
        """Command type -> handler, for the commands of this service's owner."""
        return {}

    def sockets(self) -> list:
        """zmq sockets (or file descriptors) to wait on for reading."""

    def service(self) -> None:
        """Read what is readable, run timers; never blocks."""

    def next_deadline(self) -> float | None:
        """Monotonic time of its next timer work; None: only when a socket is readable."""
        return None

    def close(self) -> None: ...


class IOThread:
    """Starts at once; `build(io)` makes the services on the new thread (their sockets belong to it;
    `io.post` is how a service's answers come back to this thread)."""

    def __init__(self, name: str, build: Callable[["IOThread"], Sequence[IOService]]):
        self.name = name
        self.mailbox = Mailbox()
        ready: Future = Future()
        self._thread = threading.Thread(target=self._run, args=(build, ready), name=name, daemon=True)
        self._thread.start()
        self.services: list[IOService] = ready.result()  # raises what building them raised

    def post(self, command) -> None:
        """From any thread: run `command` on the I/O thread, after every command posted before it."""
        self.mailbox.put(command)

    def run_pending(self) -> bool:
        """On the I/O thread: run the commands posted so far, now (from a service: a control message must not
        overtake the commands queued before it was sent); False once the thread is to stop."""
        for command in self.mailbox.take_all():
            if command is STOP:
                self.mailbox.put(command)  # still ends the thread, at the next round
                return False
            quietly(lambda: self._handlers[type(command)](command), f"{self.name}: {type(command).__name__}")
        return True

    def stop(self, timeout_s: float = 10.0) -> None:
        """Close every service on the thread and end it; idempotent."""
        if self._thread.is_alive():
            self.mailbox.put(STOP)
            self._thread.join(timeout_s)

    def _run(self, build: Callable[["IOThread"], Sequence[IOService]], ready: Future) -> None:
        try:
            services = list(build(self))
        except BaseException as err:
            ready.set_exception(err)
            return
        self._handlers = {kind: handler for s in services for kind, handler in s.commands().items()}
        ready.set_result(services)
        try:
            while self._round(services):
                pass
        finally:
            for s in services:
                quietly(s.close, f"{self.name}: closing {type(s).__name__}")
            self.mailbox.close()

    def _round(self, services: list[IOService]) -> bool:
        poller = zmq.Poller()
        poller.register(self.mailbox.fd, zmq.POLLIN)
        for s in services:
            for sock in s.sockets():
                poller.register(sock, zmq.POLLIN)
        deadlines = [d for s in services if (d := s.next_deadline()) is not None]
        poller.poll(ms_until(min(deadlines, default=None)))
        if not self.run_pending():
            return False
        for s in services:
            quietly(s.service, f"{self.name}: {type(s).__name__}")
        return True


def ms_until(deadline: float | None) -> int | None:
    """A poll's timeout in ms until `deadline` (monotonic); None: no timer, wait until a socket or message wakes it."""
    return None if deadline is None else max(0, int((deadline - time.monotonic()) * 1000) + 1)


def quietly(fn: Callable[[], object], what: str) -> None:
    """A bug in one command, service or message must not end the thread that runs it (the I/O thread answers
    heartbeats whatever a step does): log it, go on."""
    try:
        fn()
    except Exception:
        logger.exception("%s failed", what)
