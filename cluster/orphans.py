"""A deployment whose serving process is gone ends itself: its controller stops the workers, then itself.

The controller actor and the workers are detached, so that they outlive the
controller's own death (and the Ray job of the process that started them); when
the `tandem serve` process dies without stopping them (SIGKILL, a crash) on a
Ray cluster that goes on (`--address`), nothing else would. The controller sits
on that process's node (`start_controller` pins it there), so it watches the
process itself: its pid, and its start time, so that a reused pid is not taken
for it. Ownership: the controller actor runs the watch; the deployment hands it
the `ServingProcess`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class ServingProcess:
    pid: int
    started: float  # psutil's create_time: the same pid with another start time is another process

    @classmethod
    def this(cls) -> ServingProcess:
        import os

        import psutil

        return cls(os.getpid(), psutil.Process().create_time())

    def alive(self) -> bool:
        import psutil

        try:
            return psutil.Process(self.pid).create_time() == self.started
        except psutil.NoSuchProcess:
            return False


def watch_serving_process(process: ServingProcess, on_gone, interval_s: float = 2.0) -> threading.Thread:
    """A daemon thread calling `on_gone()` once `process` has ended."""

    def watch():
        while process.alive():
            stopped.wait(interval_s)
        on_gone()

    stopped = threading.Event()  # never set: the thread lives as long as the actor
    thread = threading.Thread(target=watch, name="tandem-orphan-watch", daemon=True)
    thread.start()
    return thread
