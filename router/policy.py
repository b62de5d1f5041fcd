"""The routing seam: `RoutingPolicy.pick(tokens, workers) -> worker`, and the policies by name.

A policy chooses among the live workers of one pool for a prompt's token ids.
It may keep its own state (a prefix tree, a cursor), updated in `pick` as the
dispatch happens; the caller counts the dispatch in `WorkerState.in_flight`.
`forget(name)` drops whatever a policy remembers of a worker that died or left.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

from router.worker_state import WorkerState


class RoutingPolicy(Protocol):
    def pick(self, tokens: Sequence[int], workers: Sequence[WorkerState]) -> WorkerState:
        """One of `workers` (non-empty, all alive) for this prompt; records the choice."""
        ...

    def forget(self, worker_name: str) -> None: ...


class RoundRobin:
    """Each worker in turn, whatever the prompt or the load."""

    def __init__(self):
        self._turn = 0

    def pick(self, tokens: Sequence[int], workers: Sequence[WorkerState]) -> WorkerState:
        if not workers:
            raise ValueError("no worker to pick from")
        worker = workers[self._turn % len(workers)]
        self._turn += 1
        return worker

    def forget(self, worker_name: str) -> None:
        pass


POLICIES: dict[str, Callable[..., RoutingPolicy]] = {"round_robin": RoundRobin}


def make_policy(name: str, **options) -> RoutingPolicy:
    if name not in POLICIES:
        raise ValueError(f"unknown routing policy {name!r}: choose one of {', '.join(sorted(POLICIES))}")
    return POLICIES[name](**options)
