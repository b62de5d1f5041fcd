"""scripts/serving_bench: the metric math and the arrival gaps on fixed inputs."""

from __future__ import annotations

import numpy as np
import pytest

from scripts.serving_bench.client import RequestOutput
from planner.bench_metrics import compute_metrics, in_flight_peaks, parse_goodput, per_second, percentile_key
from planner.workload import arrival_gaps

T0 = 100.0
# A: 4 tokens, TTFT 100 ms, TPOT (160 - 100) / 3 = 20 ms. B: 2 tokens, TTFT 300 ms, TPOT 100 ms. C failed.
A = RequestOutput(10, T0 + 0.0, success=True, ttft=0.1, latency=0.16, itl=[0.02] * 3, output_tokens=4)
B = RequestOutput(20, T0 + 0.5, success=True, ttft=0.3, latency=0.4, itl=[0.1], output_tokens=2)
C = RequestOutput(30, T0 + 1.2, success=False, latency=0.1, error="HTTP 500")
OUTPUTS, LENS = [A, B, C], [4, 2, 0]


def _metrics(slos=None, percentiles=(50, 99)):
    return compute_metrics(OUTPUTS, LENS, 2.0, T0, slos or {}, ["ttft", "tpot", "itl", "e2el"], list(percentiles))


def test_counts_throughputs_and_stats():
    m = _metrics()
    assert (m["completed"], m["failed"], m["total_input_tokens"], m["total_output_tokens"]) == (2, 1, 30, 6)
    assert (m["request_throughput"], m["output_throughput"], m["total_token_throughput"]) == (1.0, 3.0, 18.0)
    assert m["request_goodput"] is None
    assert m["mean_ttft_ms"] == pytest.approx(200) and m["median_ttft_ms"] == pytest.approx(200)
    assert m["std_ttft_ms"] == pytest.approx(100)  # population std, as numpy's default
    assert m["p50_ttft_ms"] == pytest.approx(200) and m["p99_ttft_ms"] == pytest.approx(298)  # linear interpolation
    assert m["mean_tpot_ms"] == pytest.approx(60) and m["p99_tpot_ms"] == pytest.approx(20 + 0.99 * 80)
    assert m["mean_itl_ms"] == pytest.approx((20 * 3 + 100) / 4) and m["median_itl_ms"] == pytest.approx(20)
    assert m["mean_e2el_ms"] == pytest.approx(280) and m["p50_e2el_ms"] == pytest.approx(280)
    assert (m["max_output_tokens_per_s"], m["max_concurrent_requests"]) == (6.0, 1)


def test_goodput_counts_requests_meeting_every_slo():
    assert _metrics({"ttft": 150})["request_goodput"] == 0.5  # A only, over 2 s
    assert _metrics({"tpot": 101})["request_goodput"] == 1.0  # both: 20 and 100 ms
    assert _metrics({"tpot": 99})["request_goodput"] == 0.5
    assert _metrics({"ttft": 1000, "e2el": 200})["request_goodput"] == 0.5
    assert _metrics({"ttft": 50})["request_goodput"] == 0.0


def test_goodput_and_percentile_names():
    assert parse_goodput(["ttft:200", "tpot:50", "e2el:1e3"]) == {"ttft": 200, "tpot": 50, "e2el": 1000}
    assert parse_goodput(None) == {}
    for bad in (["itl:5"], ["ttft"], ["ttft:-1"], ["ttft:fast"]):
        with pytest.raises(ValueError):
            parse_goodput(bad)
    assert percentile_key("ttft", 99) == "p99_ttft_ms" and percentile_key("itl", 99.9) == "p99.9_itl_ms"
    assert "p99.9_itl_ms" in _metrics(percentiles=[99.9])


def test_no_successful_request_gives_zeros_not_an_error():
    m = compute_metrics([C], [0], 1.0, T0, {"ttft": 1}, ["ttft", "tpot"], [99])
    assert (m["completed"], m["failed"], m["request_goodput"], m["mean_ttft_ms"], m["p99_tpot_ms"]) == (0, 1, 0, 0, 0)


def test_in_flight_peaks_and_tokens_per_second():
    # In flight 100.1 .. 101.6, text at 100.3, 100.8, 101.3.
    d = RequestOutput(1, T0 + 0.1, success=True, ttft=0.2, latency=1.5, itl=[0.5, 0.5], output_tokens=3)
    assert in_flight_peaks([A, B, C, d], T0, 3).tolist() == [2, 2, 0]
    tokens, running = per_second([A, B, C, d], [4, 2, 0, 3], T0, 2.5)
    assert tokens.tolist() == [4 + 2 + 2, 1, 0] and running.tolist() == [2, 2, 0]


def test_arrival_gaps():
    rng = np.random.default_rng(0)
    assert arrival_gaps(rng, 3, float("inf")) == [0.0, 0.0, 0.0]
    poisson, bursty, even = (np.array(arrival_gaps(rng, 20000, 10.0, b)) for b in (1.0, 0.25, 16.0))
    for gaps in (poisson, bursty, even):
        assert gaps.mean() == pytest.approx(0.1, rel=0.05)  # the rate holds whatever the burstiness
    # Gamma(k): coefficient of variation 1/sqrt(k): 1 (Poisson), 2 (bursty), 0.25 (even).
    assert [g.std() / g.mean() for g in (poisson, bursty, even)] == pytest.approx([1, 2, 0.25], rel=0.05)
    with pytest.raises(ValueError):
        arrival_gaps(rng, 1, 1.0, 0)
