"""A worker's step leaves one core to a grammar compile while one runs: torch's threads, one fewer meanwhile.

    threads = StepThreads()              # on the loop thread: torch's thread count there is the full one
    threads.leave_one(compiling=True)    # before a step: n - 1 threads while a compile runs, n otherwise

A grammar compile (its child process, then the worker's compile thread: `runtime.grammar_compiles`) is one
more busy thread on cores the step's torch threads fill. A step's threads meet at a barrier after every
operator, so one of them preempted by the compile holds all of them: on 2 cores a 40 ms decode step took
300-450 ms while a slow regex compiled (the stream beside it stalled that long between tokens). With one
thread fewer the step runs on the cores the compile leaves it, slower by that core's share and no more.
A worker with one thread keeps it (the operating system shares its core with the compile).

Ownership: the worker's loop thread alone (torch's thread count is per thread: the one that runs the
step must set it), constructed there.
"""

from __future__ import annotations

import torch


class StepThreads:
    def __init__(self, full: int | None = None):
        """`full`: the step's thread count with no compile running (None: torch's on this thread now)."""
        self.current = torch.get_num_threads()  # this thread's
        self.full = full or self.current

    def leave_one(self, compiling: bool) -> None:
        """Before a step: one thread fewer than `full` while `compiling` (never fewer than one), else `full`."""
        wanted = max(1, self.full - 1) if compiling else self.full
        if wanted != self.current:
            torch.set_num_threads(wanted)
            self.current = wanted
