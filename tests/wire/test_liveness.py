"""The liveness rules on a fake clock: busy is not dead, gone is, and so are wedged or always-failing workers."""

from __future__ import annotations

import pytest

from wire.liveness import Liveness, LivenessPolicy
from wire.requests import WorkerLoad


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _load(**health) -> WorkerLoad:
    return WorkerLoad("w", 0, 0, 0, 10, 10, 0.0, **health)


POLICY = LivenessPolicy(misses_before_dead=3, silent_after_s=30, stuck_factor=4, stuck_floor_s=100, max_failed_steps=3)


def test_a_long_step_is_busy_not_dead():
    live = Liveness(POLICY, Clock())
    assert live.answered(_load(step_running_s=99.0, steps=0)) is None  # under the floor, first step
    assert live.answered(_load(step_running_s=390.0, longest_step_s=100.0)) is None  # under 4x the longest
    assert "has run for 401 s" in live.answered(_load(step_running_s=401.0, longest_step_s=100.0))
    assert "has run for 101 s" in live.answered(_load(step_running_s=101.0, longest_step_s=2.0))


def test_refused_connections_are_death_after_the_misses_in_a_row():
    live = Liveness(POLICY, Clock())
    assert live.missed("gone", refused=True) is None
    assert live.missed("gone", refused=True) is None
    assert "refuses connections" in live.missed("gone", refused=True)


def test_silence_is_death_only_after_misses_and_the_silent_time():
    clock = Clock()
    live = Liveness(POLICY, clock)
    for _ in range(5):
        clock.now += 1
        assert live.missed("timed out") is None  # a stopped process answers again
    live.answered(_load())  # and one answer resets both counts
    clock.now += 29
    assert [live.missed("timed out") for _ in range(3)] == [None, None, None]
    clock.now += 1
    assert "no heartbeat answered for 30 s" in live.missed("timed out")


def test_steps_failing_in_a_row_are_death():
    live = Liveness(POLICY, Clock())
    assert live.answered(_load(failed_steps_in_a_row=2)) is None
    assert "last 3 steps failed" in live.answered(_load(failed_steps_in_a_row=3))


def test_policy_refuses_nonsense():
    with pytest.raises(ValueError):
        LivenessPolicy(misses_before_dead=0)
    with pytest.raises(ValueError):
        LivenessPolicy(stuck_floor_s=0)
