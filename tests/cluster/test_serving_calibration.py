"""The serving calibration's fit, from outcomes as its client records them (the real runs are bench_plan's)."""

from __future__ import annotations

import dataclasses

import pytest

from cluster import serving_calibration as calibration
from tests.planner.profiles import hand_profile


def _profile():
    base = hand_profile(kv_cache_tokens=16 * 4096)
    return dataclasses.replace(base, model=dataclasses.replace(base.model, vocab_size=32000))


def _served(prompt_len: int, output_len: int, ttft: float, itl: float, phases=None):
    return calibration.Outcome(prompt_len, 0.0, True, ttft, ttft + (output_len - 1) * itl, [itl] * (output_len - 1),
                               phases or {})  # fmt: skip


def _outcomes(profile, replicas: int, idle_itl: float, loaded_itl: float):
    idle = [_served(calibration.IDLE_PROMPT, calibration.IDLE_OUTPUT, 0.3, idle_itl, {"prefill_s": 0.25})] * 5
    requests = calibration._load(profile, replicas)
    loaded = [_served(len(r.prompt), r.output_len, 0.3, loaded_itl) for r in requests]
    return idle, requests, loaded


def test_one_worker_is_fitted_a_time_per_step_that_reproduces_its_served_tpot():
    profile = _profile()
    idle, requests, loaded = _outcomes(profile, 1, 0.02, 0.05)
    fitted = calibration._fitted(profile, 1, idle, requests, loaded).serving
    assert fitted.step_factor == 1.0 and fitted.alone_step_factor is None
    assert fitted.per_round_s > profile.serving.per_round_s
    assert fitted.request_s == pytest.approx(0.3 - 0.25 - 0.012, abs=0.002)  # TTFT - prefill - the window's quiet
    assert fitted.prefill_factor == pytest.approx(0.25 / 0.266)  # served prefill / profiled (10 ms + 256 x 1 ms)
    simulated = calibration._simulated_tpot(dataclasses.replace(profile, serving=fitted), 1, requests)
    assert simulated == pytest.approx(0.05, rel=0.02)
    again = calibration._fitted(calibration._fitted(profile, 1, idle, requests, loaded), 1, idle, requests, loaded)
    assert [n for n in again.notes if n.startswith("serving calibrated")] == [again.notes[-1]]  # the latest only


def test_several_workers_are_fitted_a_time_per_step_alone_and_a_factor_beside_busy_neighbours():
    profile = _profile()
    idle, requests, loaded = _outcomes(profile, 2, 0.015, 0.05)  # alone: 4 ms a step over the profiled 11 ms
    fitted = calibration._fitted(profile, 2, idle, requests, loaded).serving
    assert fitted.alone_step_factor == 1.0 and fitted.per_round_s == pytest.approx(0.004, abs=0.0005)
    assert fitted.step_factor > 1.2
    fitted_profile = dataclasses.replace(profile, serving=fitted)
    assert calibration._simulated_tpot(fitted_profile, 2, calibration._one_at_a_time(len(idle))) == pytest.approx(0.015, rel=0.02)
    simulated = calibration._simulated_tpot(fitted_profile, 2, requests)
    assert simulated == pytest.approx(0.05, rel=0.05)  # steep there: slower steps overlap more and queue more
