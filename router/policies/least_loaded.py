"""least_loaded: power of two choices over `WorkerState.pending`.

Two distinct workers drawn at random, the one with fewer pending requests wins
(the first drawn on a tie). Two random candidates instead of the global
minimum keep simultaneous routers, or a burst routed before any load report
arrives, from all piling onto the same least-loaded worker, at almost the
balance of the full scan (Mitzenmacher's power of two choices).
"""

from __future__ import annotations

import random
from typing import Sequence

from router.worker_state import WorkerState


class LeastLoaded:
    def __init__(self, seed: int | None = None):
        self._rng = random.Random(seed)

    def pick(self, tokens: Sequence[int], workers: Sequence[WorkerState],
             cache_salt: str | None = None) -> WorkerState:  # fmt: skip
        if not workers:
            raise ValueError("no worker to pick from")
        if len(workers) == 1:
            return workers[0]
        first, second = self._rng.sample(range(len(workers)), 2)
        a, b = workers[first], workers[second]
        return b if b.pending < a.pending else a

    def forget(self, worker_name: str) -> None:
        pass
