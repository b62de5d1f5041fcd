"""round_robin: each worker in turn, whatever the prompt or the load."""

from __future__ import annotations

from typing import Sequence

from router.worker_state import WorkerState


class RoundRobin:
    def __init__(self):
        self._turn = 0

    def pick(self, tokens: Sequence[int], workers: Sequence[WorkerState],
             cache_salt: str | None = None) -> WorkerState:  # fmt: skip
        if not workers:
            raise ValueError("no worker to pick from")
        worker = workers[self._turn % len(workers)]
        self._turn += 1
        return worker

    def forget(self, worker_name: str) -> None:
        pass
