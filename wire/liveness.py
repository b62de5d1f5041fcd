"""When a worker is dead, not merely busy: one judgement for the router's load polls and the controller's heartbeats.

A worker answers its heartbeat (`load()`, a `WorkerLoad`) from its I/O thread,
whatever its step loop is doing, so a long step is never a missed heartbeat.
It is dead when:

  - its process is gone: heartbeats fail `misses_before_dead` times in a row and
    the connection is refused (nobody listens there any more), or Ray reports the
    actor dead (the controller's side, `gone=True`);
  - it stopped answering: `misses_before_dead` misses in a row and no answer for
    `silent_after_s` (a process stopped for a few seconds answers again before that);
  - it answers but its loop is wedged: the step in progress has run for longer than
    `stuck_factor` times the longest step it ever finished, and at least `stuck_floor_s`;
  - it answers but every step fails (a sticky device error): `max_failed_steps` in a row.

The clock is injected so the rules are tested without sleeping.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from wire.requests import WorkerLoad


@dataclass(frozen=True)
class LivenessPolicy:
    misses_before_dead: int = 3
    silent_after_s: float = 30.0
    stuck_factor: float = 4.0
    stuck_floor_s: float = 300.0
    max_failed_steps: int = 3

    def __post_init__(self):
        if self.misses_before_dead < 1 or self.max_failed_steps < 1:
            raise ValueError("misses_before_dead and max_failed_steps must be >= 1")
        if min(self.silent_after_s, self.stuck_factor, self.stuck_floor_s) <= 0:
            raise ValueError("silent_after_s, stuck_factor and stuck_floor_s must be > 0")

    def stuck_after_s(self, longest_step_s: float) -> float:
        """How long a step may run before the worker counts as wedged."""
        return max(self.stuck_floor_s, self.stuck_factor * longest_step_s)


class Liveness:
    """One worker's heartbeat record, as one observer (router or controller) sees it."""

    def __init__(self, policy: LivenessPolicy = LivenessPolicy(), clock: Callable[[], float] = time.monotonic):
        self.policy, self.clock = policy, clock
        self.misses = 0
        self.last_answer = clock()

    def answered(self, load: WorkerLoad) -> str | None:
        """A heartbeat came back: None if the worker is alive, else why it is dead although it answers."""
        self.misses, self.last_answer = 0, self.clock()
        p = self.policy
        if load.failed_steps_in_a_row >= p.max_failed_steps:
            return f"its last {load.failed_steps_in_a_row} steps failed"
        limit = p.stuck_after_s(load.longest_step_s)
        if load.step_running_s > limit:
            return f"its step has run for {load.step_running_s:.0f} s (limit {limit:.0f} s)"
        return None

    def missed(self, reason: str, refused: bool = False) -> str | None:
        """A heartbeat failed (`refused`: nobody listens at its address): None while it may still be alive."""
        self.misses += 1
        if self.misses < self.policy.misses_before_dead:
            return None
        silent = self.clock() - self.last_answer
        if refused:
            return f"{self.misses} heartbeats in a row failed, its address refuses connections ({reason})"
        if silent >= self.policy.silent_after_s:
            return f"no heartbeat answered for {silent:.0f} s ({reason})"
        return None
