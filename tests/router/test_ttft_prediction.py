"""Admission by predicted time to first token, without workers: the rate from load reports, the
prediction over a pool, and the 429 it becomes over HTTP."""

from __future__ import annotations

import dataclasses

import pytest

from router.errors import from_dispatch
from router.ttft_prediction import FirstTokenTooLate, PromptRate, check_ttft, predicted_ttft_s
from router.worker_state import WorkerState
from wire.requests import WorkerLoad

IDLE = WorkerLoad("w", 0, 0, 0, 10, 10, 0.0)


def _load(tokens: int, seconds: float) -> WorkerLoad:
    return dataclasses.replace(IDLE, prompt_tokens_advanced=tokens, prompt_seconds=seconds)


def test_the_rate_is_measured_over_recent_reports_and_starts_over_with_the_worker():
    rate = PromptRate()
    assert rate.tokens_per_s is None
    rate.observe(_load(0, 0.0))
    assert rate.tokens_per_s is None  # no prompt computed yet
    rate.observe(_load(1000, 0.1))
    assert rate.tokens_per_s == pytest.approx(10_000)  # too little time in the window: the cumulative figure
    rate.observe(_load(1500, 1.1))
    assert rate.tokens_per_s == pytest.approx(1500 / 1.1)
    rate.observe(_load(100, 1.0))  # a restarted worker: its counters started over
    assert rate.tokens_per_s == pytest.approx(100)


def test_the_rate_settles_once_a_whole_window_has_seen_no_prompt_work():
    rate = PromptRate()
    rate.observe(_load(0, 0.0))
    rate.observe(_load(1000, 0.5))
    assert not rate.settled
    for _ in range(40):
        rate.observe(_load(1000, 0.5))
    assert rate.settled and rate.tokens_per_s == pytest.approx(2000)
    rate.observe(_load(1200, 0.6))
    assert not rate.settled


def _worker(queued: int, tokens_per_s: float | None) -> WorkerState:
    worker = WorkerState("w", "prefill", prompt_tokens_queued=queued)
    if tokens_per_s is not None:
        worker.prompt_rate.observe(_load(int(tokens_per_s * 10), 10.0))
    return worker


def test_the_best_worker_decides_and_a_worker_without_a_rate_predicts_nothing():
    busy, idle_slow = _worker(queued=9000, tokens_per_s=1000), _worker(queued=0, tokens_per_s=100)
    assert predicted_ttft_s([busy, idle_slow], 1000) == pytest.approx(10.0)  # min(10 s, 10 s)
    assert predicted_ttft_s([busy], 1000) == pytest.approx(10.0)
    assert predicted_ttft_s([_worker(queued=10**6, tokens_per_s=None)], 1000) is None
    check_ttft([busy], 1000, deadline_s=10.0)  # exactly at the deadline: admitted
    check_ttft([busy], 10**6, deadline_s=0)  # no deadline


def test_a_request_predicted_late_is_a_429_with_retry_after():
    with pytest.raises(FirstTokenTooLate) as refused:
        check_ttft([_worker(queued=20_000, tokens_per_s=1000)], 500, deadline_s=5.0)
    error = from_dispatch(refused.value)
    assert (error.status, error.code) == (429, "too_many_requests")
    assert error.headers == {"Retry-After": "16"}  # 20.5 s predicted, 5 s allowed
    assert "predicted in 20 s" in error.message
