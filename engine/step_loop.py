"""One thread that owns a worker: it builds it, steps it, and runs other threads' calls between steps.

The engine and the KV connector are not thread-safe (ZMQ sockets belong to
one thread), so a worker served from several threads (a Ray actor's calls, a
test) keeps every call on this thread: `call(fn)` runs `fn(worker)` here and
returns its result, or raises its exception, to the caller.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
from concurrent.futures import Future
from typing import Callable, Generic, Protocol, TypeVar

logger = logging.getLogger("tandem.engine")

R = TypeVar("R")


class Steppable(Protocol):
    def step(self) -> bool:
        """Do one round of work; True if there may be more to do at once."""

    def close(self) -> None: ...


W = TypeVar("W", bound=Steppable)


class StepLoop(Generic[W]):
    def __init__(self, make_worker: Callable[[], W], name: str, idle_wait_s: float = 0.002):
        self.name, self.idle_wait_s = name, idle_wait_s
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._stopped = False
        ready: Future = Future()
        self._thread = threading.Thread(target=self._run, args=(make_worker, ready), name=name, daemon=True)
        self._thread.start()
        ready.result()  # raises what building the worker raised

    def call(self, fn: Callable[[W], R], timeout: float | None = 60.0) -> R:
        return self.submit(fn).result(timeout)

    def submit(self, fn: Callable[[W], R]) -> Future:
        """`call` without waiting: the future gets `fn(worker)`'s result or exception (set on the loop's thread)."""
        if self._stopped:
            raise RuntimeError(f"{self.name} is stopped")
        done: Future = Future()
        self._calls.put((fn, done))
        return done

    def stop(self, timeout: float = 30.0) -> None:
        """Close the worker on its thread and end the loop."""
        if not self._stopped:
            self.call(self._close, timeout)
            self._thread.join(timeout)

    def _close(self, worker: W) -> None:
        self._stopped = True
        worker.close()

    def _run(self, make_worker: Callable[[], W], ready: Future) -> None:
        try:
            worker = make_worker()
        except BaseException as e:
            ready.set_exception(e)
            return
        ready.set_result(None)
        busy = True
        while not self._stopped:
            self._run_calls(worker, wait_s=0.0 if busy else self.idle_wait_s)
            if self._stopped:
                break
            try:
                busy = worker.step()
            except Exception:
                # The worker's own step handles request failures; anything here is a bug: keep serving.
                logger.exception("%s: step failed", self.name)
                busy = False

    def _run_calls(self, worker: W, wait_s: float) -> None:
        try:
            item = self._calls.get(timeout=wait_s) if wait_s > 0 else self._calls.get_nowait()
        except queue.Empty:
            return
        while True:
            fn, done = item
            try:
                done.set_result(fn(worker))
            except BaseException as e:
                done.set_exception(e)
            try:
                item = self._calls.get_nowait()
            except queue.Empty:
                return


class LoopedActor:
    """Body of a worker's Ray actor: the worker lives on a StepLoop; each method is one call onto it.

    Methods take and return msgpack bytes or plain ids and booleans (never pickled objects of ours).
    Tensor-parallel rank 0 (`start=False`): the constructor is cheap and `start(init_addr)` builds
    the worker, joining the follower ranks (engine.parallel.ray_group starts them all together)."""

    def __init__(self, make_worker: Callable[[object], Steppable], engine_args, name: str,
                 torch_threads: int | None = 1, start: bool = True):  # fmt: skip
        if torch_threads is not None:
            import torch

            torch.set_num_threads(torch_threads)  # several actors share the host's cores
        self._make_worker, self.engine_args, self.name = make_worker, engine_args, name
        self.loop: StepLoop | None = None
        if start:
            self.loop = StepLoop(lambda: make_worker(engine_args), name)
            self.on_started()

    def on_started(self) -> None:
        """The worker is built: a subclass starts serving it here (e.g. its control socket)."""

    def on_stopping(self) -> None:
        """`shutdown` begins: a subclass stops what `on_started` started."""

    def free_init_addr(self) -> str:
        from engine.parallel.ray_group import free_init_addr

        return free_init_addr()

    def start(self, init_addr: str) -> None:
        """Build the worker as rank 0 of its tensor-parallel group, meeting the other ranks at `init_addr`."""
        args = dataclasses.replace(self.engine_args, tensor_parallel_rank=0, dist_init_addr=init_addr)
        self.loop = StepLoop(lambda: self._make_worker(args), self.name)
        self.on_started()

    def attach_followers(self, endpoints: list[bytes]) -> None:
        """Rank 0: the follower ranks' I/O workers (their `start` answers, rank order)."""
        self.loop.call(lambda w: w.attach_followers(endpoints))

    def abort(self, request_id: str) -> None:
        self.loop.call(lambda w: w.abort(request_id))

    def is_idle(self) -> bool:
        return self.loop.call(lambda w: w.is_idle())

    def pool_all_free(self) -> bool:
        return self.loop.call(lambda w: w.pool_all_free())

    def shutdown(self) -> bool:
        """Stop the loop, aborting what is left; True if the block pool was all free before that."""
        self.on_stopping()
        all_free = self.loop.call(lambda w: w.is_idle() and w.pool_all_free())
        self.loop.stop()
        return all_free
