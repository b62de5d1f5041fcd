"""scripts/cluster_bench: which layouts a run starts, the targets' verdicts, and the hit rates read from /metrics."""

from __future__ import annotations

from scripts.cluster_bench.report import check_targets
from scripts.cluster_bench.servers import hit_rate_between, tandem_hit_rate
from scripts.cluster_bench.sweeps import COLOCATED, DISAGGREGATED, FULL, deployments, scaled, sweeps


def test_layouts_shared_by_sweeps_start_once_and_run_each_of_their_loads():
    plan = deployments(sweeps(FULL))
    assert len(plan) == 7  # 1P+1D, 2 colocated, three 2P+1D policies, 1P+2D, 1 colocated with 2 threads
    assert [s.name for s in plan[DISAGGREGATED]] == ["mixed", "ratio", "serving"]
    assert [s.name for s in plan[COLOCATED]] == ["mixed", "serving"]
    routing_first = [sweeps_of[0].name for config, sweeps_of in plan.items() if config.num_prefill == 2]
    assert routing_first == ["routing"] * 3  # its hit rates are the workers' first load
    assert [s.workload.name for s in sweeps(FULL, ("routing",))] == ["shared_prefix"]
    assert scaled(FULL, 0.5).mixed_rate == FULL.mixed_rate / 2


def test_targets_give_the_ratio_and_the_verdict_or_say_what_is_missing():
    mixed = sweeps(FULL, ("mixed",))[0]
    rows = [{"config": DISAGGREGATED.label, "p99_tpot_ms": 50.0, "request_goodput": 0.2},
            {"config": COLOCATED.label, "p99_tpot_ms": 200.0, "request_goodput": 0.0}]  # fmt: skip
    tpot, goodput = check_targets(mixed, rows)
    assert "0.25x (50.00 against 200.00): **met**" in tpot
    assert "not measurable" in goodput  # no ratio to a zero goodput
    rows[1]["request_goodput"], rows[1]["p99_tpot_ms"] = 0.4, 100.0
    assert all("**not met**" in line for line in check_targets(mixed, rows))


METRICS = """# HELP tandem:worker_prefix_cache_hit_rate A worker's own prefix-cache hit rate.
tandem:worker_prefix_cache_hit_rate{role="prefill",worker="prefill-0"} 0.5
tandem:worker_prefix_cache_hit_rate{role="prefill",worker="prefill-1"} 0.25
tandem:worker_prefix_cache_hit_rate{role="decode",worker="decode-0"} 0.9
"""


def test_hit_rates_from_tandem_worker_gauges_and_from_vllm_counters():
    assert tandem_hit_rate(METRICS) == 0.375  # the prefill workers' mean: the decode side is not prefill routing
    assert tandem_hit_rate(METRICS.replace('role="prefill"', 'role="decode"')) == (0.5 + 0.25 + 0.9) / 3
    assert tandem_hit_rate("") is None
    before = 'vllm:prefix_cache_queries_total{engine="0"} 100.0\nvllm:prefix_cache_hits_total{engine="0"} 10.0\n'
    after = 'vllm:prefix_cache_queries_total{engine="0"} 300.0\nvllm:prefix_cache_hits_total{engine="0"} 110.0\n'
    assert hit_rate_between(before, after) == 0.5  # (110 - 10) / (300 - 100): this run's only
