"""engine.layers.kernel_timing: how kernel candidates are timed, with a clock the test controls."""

from __future__ import annotations

import pytest

from engine.layers import kernel_timing, linear_choice
from engine.layers.kernel_timing import fastest, sample_time


def test_a_burst_of_other_work_does_not_decide_for_the_candidate_it_hit():
    # "native" costs 1 and "torch" 3, but the first five samples taken (whoever's) cost 10 more: another
    # process starting beside the worker. Timed one candidate after the other, native's samples would all
    # be slowed and torch would win; taking turns, native's later rounds show its speed.
    taken = []

    def timer(call):
        taken.append(call())
        return taken[-1] + (10 if len(taken) <= 5 else 0)

    assert fastest({"native": [lambda: 1], "torch": [lambda: 3]}, timer) == "native"
    assert len(taken) == 2 * kernel_timing.ROUNDS


def test_a_candidates_calls_are_summed_and_each_is_warmed_once_first():
    calls = []

    def recorded(name, cost):
        return lambda: calls.append(name) or cost

    # "split" is the cheaper on one shape but dearer over both.
    candidates = {"split": [recorded("split", 1), recorded("split", 5)], "whole": [recorded("whole", 4)]}
    assert fastest(candidates, timer=lambda call: call(), rounds=2) == "whole"
    assert calls[:3] == ["split", "split", "whole"]  # the warm runs, before any sample


def test_a_sample_spans_the_minimum_time_however_short_the_call(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(kernel_timing.time, "perf_counter", lambda: now[0])
    calls = []

    def op():  # a call of 0.5 ms on the fake clock
        calls.append(1)
        now[0] += 0.0005

    assert sample_time(op, min_s=0.002) == pytest.approx(0.0005) and len(calls) == 4
    calls.clear()
    assert sample_time(lambda: op() or op() or op() or op() or op(), min_s=0.002) == pytest.approx(0.0025) and len(calls) == 5


def test_a_choice_cached_under_another_way_of_timing_is_timed_again(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path))
    computed = []

    def compute():
        computed.append(1)
        return ("a",) * len(linear_choice.BANDS)

    linear_choice.cached_choice(["cpu x"], compute)
    linear_choice.cached_choice(["cpu x"], compute)
    assert len(computed) == 1
    monkeypatch.setattr(linear_choice, "METHOD", "another way")
    linear_choice.cached_choice(["cpu x"], compute)
    assert len(computed) == 2
