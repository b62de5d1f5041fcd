"""A worker's step leaves one core to a grammar compile: torch's threads on the thread that steps."""

from __future__ import annotations

import threading

import torch

from runtime.step_threads import StepThreads


def _on_a_thread(work):
    """`work()` on a fresh thread (torch's thread count is per thread), its result."""
    out = []
    thread = threading.Thread(target=lambda: out.append(work()))
    thread.start()
    thread.join()
    return out[0]


def test_one_thread_fewer_while_a_compile_runs_never_none():
    def steps(full):
        threads, seen = StepThreads(full), []
        for compiling in (False, True, True, False):
            threads.leave_one(compiling)
            seen.append(torch.get_num_threads())
        return seen

    assert _on_a_thread(lambda: steps(3)) == [3, 2, 2, 3]
    assert _on_a_thread(lambda: steps(1)) == [1, 1, 1, 1]  # one thread: the core is shared by the system
