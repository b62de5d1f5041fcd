"""A worker hosted in this process: its loop thread (which starts its I/O thread) and its load board.

    hosted = HostedWorker(name, make_worker)    make_worker(board, deliver) runs on the loop thread
    hosted.call("reserve", request)             a `Call` through the loop, as the router's arrive
    hosted.heartbeat()                          never waits for a step
    hosted.stop()                               every request ended, threads and sockets gone

The Ray actors (`runtime.actor`) and in-process tests hold one of these.
"""

from __future__ import annotations

from typing import Callable

from wire.requests import WorkerLoad
from runtime.load_board import LoadBoard
from runtime.loop import LoopWorker, WorkerLoop


class HostedWorker:
    def __init__(self, name: str, make_worker: Callable[[LoadBoard, Callable[[object], None]], LoopWorker],
                 board: LoadBoard | None = None):  # fmt: skip
        self.name = name
        self.board = board or LoadBoard(name)
        self.loop = WorkerLoop(name, self.board, lambda deliver: make_worker(self.board, deliver))

    @property
    def worker(self) -> LoopWorker:
        return self.loop.worker

    def call(self, method: str, arg=None, timeout_s: float | None = 60.0):
        """A call as the router makes it (it renews the router's lease), answered by the loop."""
        self.board.router_seen()
        return self.loop.call(method, arg, timeout_s)

    def heartbeat(self) -> WorkerLoad:
        return self.board.heartbeat()

    def is_clean(self) -> bool:
        """Asked of the loop itself: idle and every block free right now."""
        return bool(self.loop.call("is_clean"))

    def stop(self, timeout_s: float = 30.0) -> None:
        self.loop.stop(timeout_s)
