"""A worker's loop thread: the one thread that owns its engine and its requests.

    round:  wait (blocking) for the mailbox, the worker's own sockets or its next deadline;
            no wait at all while the engine has work
            handle every message (a router `Call`, an event from the I/O thread)
            read the worker's sockets (decode inbox, tensor-parallel rank links)
            run the timers that are due (leases, acks, first-token deadlines)
            one engine step when there is work  (board.step_began / step_ended around it)
            publish a snapshot to the LoadBoard

The I/O thread answers heartbeats from that board, so a long step here is busy,
never dead. Messages are typed; the worker dispatches them by type (`LoopWorker`).
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from typing import Callable

import zmq

from runtime.control_service import Call
from runtime.io_thread import ms_until, quietly
from runtime.load_board import LoadBoard, LoopSnapshot
from runtime.mailbox import STOP, Mailbox

logger = logging.getLogger("tandem.runtime")


class LoopWorker:
    """What a loop runs (both roles' `runtime.request_table.RequestTable`, `CallsOnlyWorker`). A method kept as
    it is here is a worker without that part: no sockets of its own, no engine steps, no timers."""

    def handle(self, message) -> None:
        """A message posted to the loop: a `Call` from the router or a lifecycle caller, or an I/O event."""
        raise NotImplementedError

    def sockets(self) -> list:
        """The loop thread's own sockets to wait on (they are read in `read_sockets`)."""
        return []

    def read_sockets(self) -> None:
        pass

    def has_work(self) -> bool:
        """An engine step to run now."""
        return False

    def step(self) -> bool | None:
        """One engine step and its outputs; False if the step failed (its requests were ended), None if it failed
        for a request's fault, not the worker's (`runtime.request_table.RequestTable.failed_step`)."""
        return True

    def next_deadline(self) -> float | None:
        """Monotonic time of its next timer; None: none."""
        return None

    def check_deadlines(self, now: float | None = None) -> None:
        """End what is overdue at `now` (monotonic seconds; None: now): tests pass a time instead of sleeping."""

    def snapshot(self) -> LoopSnapshot:
        raise NotImplementedError

    def close(self) -> None:
        """End every request (clients get a final delta), stop the I/O thread, free sockets."""


class WorkerLoop:
    """Starts the thread; `make_worker(deliver)` builds the worker on it (`deliver` posts to this loop)."""

    def __init__(self, name: str, board: LoadBoard, make_worker: Callable[[Callable[[object], None]], LoopWorker]):
        self.name, self.board = name, board
        self.mailbox = Mailbox()
        ready: Future = Future()
        self._thread = threading.Thread(target=self._run, args=(make_worker, ready), name=name, daemon=True)
        self._thread.start()
        self.worker: LoopWorker = ready.result()  # raises what building the worker raised

    def post(self, message) -> None:
        """From any thread: `message` is handled on the loop, after every one posted before it."""
        if self.mailbox.closed:
            raise RuntimeError(f"{self.name} is stopped")
        self.mailbox.put(message)

    def call(self, method: str, arg=None, timeout_s: float | None = 60.0):
        """Post a `Call` and wait for its answer (lifecycle methods, tests); raises the worker's error."""
        done: Future = Future()

        def answer(result=None, error: BaseException | None = None) -> None:
            done.set_exception(error) if error is not None else done.set_result(result)

        self.post(Call(method, arg, answer))
        return done.result(timeout_s)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Close the worker on its thread and end the loop; idempotent."""
        if self._thread.is_alive():
            self.post(STOP)
            self._thread.join(timeout_s)

    # ---- the thread ------------------------------------------------------------
    def _run(self, make_worker, ready: Future) -> None:
        try:
            worker = make_worker(self.post)
        except BaseException as err:
            ready.set_exception(err)
            self.mailbox.close()
            return
        self.board.publish(worker.snapshot())  # the pool's size is known before the first request
        ready.set_result(worker)
        try:
            while self._round(worker):
                pass
        finally:
            quietly(worker.close, f"{self.name}: closing")
            self.mailbox.close()

    def _round(self, worker: LoopWorker) -> bool:
        poller = zmq.Poller()
        poller.register(self.mailbox.fd, zmq.POLLIN)
        for sock in worker.sockets():
            poller.register(sock, zmq.POLLIN)
        poller.poll(0 if worker.has_work() else ms_until(worker.next_deadline()))
        for message in self.mailbox.take_all():
            if message is STOP:
                return False
            quietly(lambda: worker.handle(message), f"{self.name}: handling {type(message).__name__}")
        quietly(worker.read_sockets, f"{self.name}: reading its sockets")
        quietly(worker.check_deadlines, f"{self.name}: deadlines")
        if worker.has_work():
            self.board.step_began()
            ok = False
            try:
                ok = worker.step()
            except Exception:
                logger.exception("%s: step failed", self.name)  # a bug: count it, keep serving
            self.board.step_ended(ok)
        self.board.publish(worker.snapshot())
        return True


class CallsOnlyWorker(LoopWorker):
    """A `LoopWorker` with no engine and no sockets of its own: it answers each `Call` with
    `getattr(self, method)(arg)` (stub workers of benchmarks, control-plane tests). Subclasses set `load`."""

    load = None  # the WorkerLoad its snapshots report

    def handle(self, call: Call) -> None:
        try:
            result = getattr(self, call.method)(call.arg)
        except Exception as err:
            return call.answer(None, err)
        call.answer(result)

    def snapshot(self) -> LoopSnapshot:
        return LoopSnapshot(self.load, True, True)
