"""What an embedded Ray leaves behind when its core dies, and ending it with `tandem serve`.

`tandem serve` with no `--address` starts a Ray of its own (`deployment.connect_ray`): a GCS, a raylet, the
raylet's agents and the workers, all descendants of the serving process. When the GCS and the raylet die
(killed, out of memory), the agents are orphaned, re-parented away from `tandem serve`, and linger until
they notice (the dashboard and runtime-env agents: ~40 s, measured on 2 cores), while `ray.shutdown()`
first waits ~19 s on the dead raylet (its driver shutdown) before it kills anything. So the serving
process remembers its descendants while Ray lives (`note`, at each of the lifeline's checks) and, once
Ray's core is gone, kills what is left of them itself (`end`) instead of calling `ray.shutdown()`, and
ends without the interpreter's exit (Ray's core worker in the process would crash in it: `cluster.cli`).
"""

from __future__ import annotations

import contextlib

import psutil


class EmbeddedRayProcesses:
    """The serving process's descendants seen so far (a process is known by its pid and start time, so a
    reused pid is never taken for one of them). `root_pid`: whose descendants (None: this process's)."""

    def __init__(self, root_pid: int | None = None):
        self._root_pid = root_pid
        self._known: dict[tuple[int, float], psutil.Process] = {}

    def note(self) -> None:
        """Remember the descendants running now (the lifeline's thread calls this every second)."""
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(self._root_pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    self._known.setdefault((child.pid, child.create_time()), child)

    def end(self) -> int:
        """Ray's core is gone: kill every remembered process still running; returns how many were killed."""
        killed = 0
        for process in self._known.values():
            with contextlib.suppress(psutil.Error):  # gone meanwhile, or its pid reused: not ours any more
                if running(process):
                    process.kill()
                    killed += 1
        return killed


def running(process: psutil.Process) -> bool:
    """Whether `process` still runs: a zombie (ended, not yet reaped by its parent) does not."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
