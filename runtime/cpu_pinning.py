"""Pin a worker rank's process to the cores it was given, before its compute threads start.

Linux sets affinity per thread: `os.sched_setaffinity(0, ...)` moves only the calling thread, and threads
started later inherit their creator's. So every thread the process has now (Ray's, the actor's) is moved,
and the threads torch and OpenMP start afterwards inherit the set. OpenMP's own binding
(`OMP_PROC_BIND` / `OMP_PLACES`) is not used: inside a Ray worker it was found to put every thread on core 0.
"""

from __future__ import annotations

import os


def pin_this_process(cores: tuple[int, ...]) -> tuple[int, ...]:
    """Every thread of this process, and those it starts later, onto `cores`; returns the set read back."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except OSError:  # a thread that ended meanwhile
            continue
    return tuple(sorted(os.sched_getaffinity(0)))
