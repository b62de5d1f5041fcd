"""What a worker says about itself while its loop may be inside a long step: the loop writes, any thread reads.

    loop thread                                  I/O thread, Ray actor threads
    step_began() ... forward ... step_ended(ok)  heartbeat() -> WorkerLoad: the loop's last snapshot,
    publish(LoopSnapshot) after every round                  the I/O side's counters, the step clock
                                                 router_seen() on every call from the router

Each field is replaced whole (one reference, or one float), so readers never
see a half-written snapshot and nobody waits for the loop. This is how
"busy" differs from "dead" (`wire.liveness`): the heartbeat is answered
whatever the loop does, and says how long its current step has run.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable

from wire.requests import WorkerLoad
from wire.socket_security import refusals


@dataclass(frozen=True)
class LoopSnapshot:
    load: WorkerLoad  # queues and blocks as of the end of the loop's last round (health fields unset)
    idle: bool  # no request held anywhere (engine, transfers, records)
    pool_all_free: bool  # every KV block back in the pool


class LoadBoard:
    def __init__(self, name: str, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.snapshot = LoopSnapshot(WorkerLoad(name, 0, 0, 0, 0, 0, 0.0), idle=True, pool_all_free=True)
        self.io_counters: Callable[[], dict] = dict  # I/O-thread figures merged into each heartbeat (KV received)
        self.steps = self.failed_in_a_row = 0
        self.longest_step_s = 0.0
        self.step_started_at: float | None = None
        self.router_last_seen = clock()

    # ---- the loop's side -----------------------------------------------------
    def publish(self, snapshot: LoopSnapshot) -> None:
        self.snapshot = snapshot

    def step_began(self) -> None:
        self.step_started_at = self.clock()

    def step_ended(self, ok: bool | None) -> None:
        """`ok` None: the step failed for a request's fault (`LoopWorker.step`): failures in a row stay as they are."""
        started, self.step_started_at = self.step_started_at, None
        if started is not None:
            self.longest_step_s = max(self.longest_step_s, self.clock() - started)
        self.steps += 1
        if ok is not None:
            self.failed_in_a_row = 0 if ok else self.failed_in_a_row + 1

    # ---- anyone's ------------------------------------------------------------
    def router_seen(self) -> None:
        """A call from the router arrived (its lease on what this worker holds is renewed)."""
        self.router_last_seen = self.clock()

    def heartbeat(self) -> WorkerLoad:
        started = self.step_started_at
        running_s = self.clock() - started if started is not None else 0.0
        return dataclasses.replace(
            self.snapshot.load, **self.io_counters(), steps=self.steps, step_running_s=running_s,
            longest_step_s=self.longest_step_s, failed_steps_in_a_row=self.failed_in_a_row,
            refused=tuple((kind, reason, count) for (kind, reason), count in sorted(refusals().items())),
        )  # fmt: skip
