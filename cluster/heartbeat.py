"""A worker's heartbeats as the controller reads them, judged by `wire.liveness`.

Every rank of a worker is probed on its own: rank 0 by its `load()` (a
`WorkerLoad`, answered by the worker's I/O thread whatever its step loop does),
a tensor-parallel follower by Ray's readiness call, so a dead follower is seen
within seconds through its own heartbeat rather than when rank 0's collective
times out. One call is in flight per rank: a rank that does not answer is not
sent a pile of calls to answer later. Each `check` is non-blocking:

    answered          `Liveness.answered(load)`: dead if wedged or failing every step
    no answer yet     one miss per `timeout_s` of waiting (`Liveness.missed`): dead only
                      after several in a row and a silence (busy is not dead)
    Ray: actor dead   dead at once (its process or its node is gone)
    the call failed   a miss (the worker answered with an error, or Ray could not reach it for now)

Ownership: the controller keeps one `WorkerWatch` per worker it serves and drops
it with the worker; the probes (`PoolWorker.probes`) know how to reach each rank.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Protocol

from wire.liveness import Liveness, LivenessPolicy
from wire.requests import WorkerLoad

# A follower's readiness says only that its process answers; rank 0's load carries the group's step health.
FOLLOWER_ALIVE = WorkerLoad("follower", 0, 0, 0, 0, 0, 0.0)


@dataclass(frozen=True)
class Answer:
    """What one heartbeat call came back with."""

    load: WorkerLoad = FOLLOWER_ALIVE
    error: str = ""  # the call failed: why
    gone: bool = False  # Ray reports the actor dead: no later call will answer


class Probe(Protocol):
    """One rank's heartbeat call (Ray's in `cluster.workers`, a scripted one in tests)."""

    rank: int

    def send(self) -> object:
        """Start one call; returns what `poll` takes."""

    def poll(self, call) -> Answer | None:
        """The call's answer, or None while it has not come back (never blocks)."""


class RankWatch:
    def __init__(self, probe: Probe, policy: LivenessPolicy, timeout_s: float, clock: Callable[[], float]):
        self.probe, self.timeout_s, self.clock = probe, timeout_s, clock
        self.liveness = Liveness(policy, clock)
        self._call, self._waiting_since = None, 0.0

    def check(self) -> str | None:
        """None while the rank may be alive; else why it is dead."""
        if self._call is None:
            self._call, self._waiting_since = self.probe.send(), self.clock()
        answer = self.probe.poll(self._call)
        if answer is None:
            if self.clock() - self._waiting_since < self.timeout_s:
                return None
            self._waiting_since = self.clock()  # the call stays in flight: a late answer still counts
            return self.liveness.missed(f"no answer within {self.timeout_s:g} s")
        self._call = None
        if answer.gone:
            return f"Ray reports it dead ({answer.error})"
        if answer.error:
            return self.liveness.missed(answer.error)
        return self.liveness.answered(answer.load)


class WorkerWatch:
    """Every rank of one worker: the worker is dead when any rank is (a TP group dies as a whole)."""

    def __init__(self, worker, probes: list[Probe], policy: LivenessPolicy, timeout_s: float,
                 clock: Callable[[], float] = time.monotonic):  # fmt: skip
        self.worker = worker  # the PoolWorker watched: a replacement under the same name gets a new watch
        self.ranks = [RankWatch(probe, policy, timeout_s, clock) for probe in probes]

    def check(self) -> str | None:
        for rank in self.ranks:
            reason = rank.check()
            if reason is not None:
                return f"heartbeat of rank {rank.probe.rank}: {reason}"
        return None
