"""A worker's ranks as the controller watches them: what the router cannot see.

One judge of a worker's health: the router's (`router.registry`), which reads rank 0's `load()` over its
control socket and takes it for dead when it is silent, wedged in a step or failing every step; the
controller acts on that verdict (`Controller.check_health`: "the router marked it dead"). What the router
cannot see is watched here, through Ray: a rank's process gone (rank 0's or a tensor-parallel follower's,
so a dead follower is seen within seconds rather than when rank 0's collective times out) or out of
Ray's reach for long. Every rank is probed by Ray's readiness call, answered beside a running step. One
call is in flight per rank: a rank that does not answer is not sent a pile of calls to answer later.
Each `check` is non-blocking:

    answered          alive (`Liveness.answered`: its misses are forgotten)
    no answer yet     one miss per `timeout_s` of waiting (`Liveness.missed`): dead only
                      after several in a row and a silence (busy is not dead)
    Ray: actor dead   dead at once (its process or its node is gone)
    the call failed   a miss (Ray could not reach it for now)

Ownership: the controller keeps one `WorkerWatch` per worker it serves and drops
it with the worker; the probes (`PoolWorker.probes`) know how to reach each rank.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Protocol

from wire.liveness import Liveness, LivenessPolicy
from wire.requests import WorkerLoad

# A readiness answer says only that the rank's process answers; step health is the router's to judge.
READY = WorkerLoad("ready", 0, 0, 0, 0, 0, 0.0)


@dataclass(frozen=True)
class Answer:
    """What one readiness call came back with."""

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
        return self.liveness.answered(READY)


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
