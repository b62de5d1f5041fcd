"""scripts/cluster_bench: which layouts a run starts, the targets' verdicts, and the hit rates read from /metrics."""

from __future__ import annotations

from scripts.cluster_bench import predict
from scripts.cluster_bench.report import check_targets, prediction_table
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


def test_a_configuration_and_its_load_become_tandem_simulates_flags():
    routing = sweeps(FULL, ("routing",))[0]
    flags = predict.layout_flags(routing.configs[2], {"max_num_seqs": 64, "max_model_len": None})
    assert flags == ("--num-prefill", "2", "--num-decode", "1", "--torch-threads", "1", "--routing-policy",
                     "round_robin", "--max-num-seqs", "64")  # fmt: skip  (a knob not given: the default)
    workload = predict.workload_flags(routing.workload)
    assert workload[workload.index("--dataset-name") + 1] == "prefix_repetition"  # simulate's spelling
    assert len(workload) == len(routing.workload.flags)


def test_the_prediction_table_sets_each_metric_beside_its_measurement_with_the_error():
    rows = [{"config": "1P+1D", "mean_ttft_ms": 200.0, "p99_tpot_ms": 50.0, "request_goodput": 0.5,
             "predicted": {"mean_ttft_ms": 220.0, "p99_tpot_ms": 40.0, "request_goodput": 0.5}},
            {"config": "vLLM", "mean_ttft_ms": 100.0}]  # fmt: skip
    header, rule, row = prediction_table(rows)[2:]
    assert header.startswith("| configuration | TTFT mean |") and rule.count("|---") == 7
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[0] == "1P+1D" and cells[1] == "200 / 220 (+10%)" and cells[4] == "50.0 / 40.0 (-20%)"
    assert cells[2] == "– / –" and cells[6] == "0.50 / 0.50 (+0%)"  # not measured: a dash; vLLM: no row
    assert prediction_table(rows[1:]) == []


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
