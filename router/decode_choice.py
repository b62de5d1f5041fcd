"""Which decode worker takes a request: the most free KV blocks, then the fewest pending requests.

One function so that a better choice (the routing-policy work) can replace it in one place.
"""

from __future__ import annotations

from typing import Sequence

from router.worker_state import WorkerState


def pick_decode(workers: Sequence[WorkerState]) -> WorkerState:
    """One of `workers` (non-empty, all alive); counts nothing itself (the dispatcher counts `in_flight`)."""
    if not workers:
        raise ValueError("no decode worker to pick from")
    return max(workers, key=lambda w: (w.free_blocks, -w.pending))
