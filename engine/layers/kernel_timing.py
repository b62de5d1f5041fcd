"""How the kernel choices (linear_choice, elementwise_choice, attention.prefill_choice) time their candidates.

A worker times its candidates once per machine, at its first start, and the answer is cached for good, so one
wrong verdict costs every later start. The moment of timing is a busy one: Ray's processes and the other
workers start beside it on the same few cores. The first way of timing (one warm call, then the median of
five single calls, one candidate after the other) let that noise decide: on an AMD EPYC with 2 cores, with
the kernels capped at AVX2, a worker's first start chose PyTorch's silu(gate) * up for two bands of row
counts and PyTorch's norms and rotary for one, where the native ops are 3-10x faster at every band (0.33 vs
3.5 ms at 1,024 rows). Five calls of a 0.3 ms op all fit in one time slice another process takes.

So here every sample runs for at least `MIN_SAMPLE_S` (many calls of a microsecond op, one of a long one),
the candidates take turns, round after round (a burst of other work slows each candidate's samples of that
moment, not one candidate's all), and each is judged by its best round: its speed when nothing else ran.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Mapping, Sequence

Call = Callable[[], object]
Timer = Callable[[Call], float]  # seconds one call of it takes
MIN_SAMPLE_S = 0.002
ROUNDS = 5
# Part of every cached choice's key: a choice timed another way is timed again.
METHOD = f"turns, best of {ROUNDS} rounds, samples of {MIN_SAMPLE_S * 1000:g} ms at least"


def sample_time(fn: Call, min_s: float = MIN_SAMPLE_S) -> float:
    """Seconds per call of `fn`, over as many calls as fill `min_s` (one at least)."""
    calls, start = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_s:
            return elapsed / calls


def fastest(candidates: Mapping[str, Sequence[Call]], timer: Timer = sample_time, rounds: int = ROUNDS) -> str:
    """The name of the candidate whose calls (summed: a kernel on each of a model's shapes) take least time
    in its best round; the candidates take turns within each round, after one warm run each (first-touch
    pages, lazy initialisation)."""
    for calls in candidates.values():
        for call in calls:
            call()
    best = dict.fromkeys(candidates, math.inf)
    for _ in range(rounds):
        for name, calls in candidates.items():
            best[name] = min(best[name], sum(timer(call) for call in calls))
    return min(best, key=best.get)
