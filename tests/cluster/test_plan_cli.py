"""`tandem simulate` and `tandem plan` from the command line: vLLM's result keys, a spec `serve` takes, a plot,
and every bad input a clear error naming what is wrong."""

from __future__ import annotations

import dataclasses
import json

import pytest

from cluster.cli import main
from cluster.spec import load_spec
from tests.planner.profiles import hand_profile

WORKLOAD = ["--dataset-name", "random", "--random-input-len", "64", "--random-output-len", "16", "--num-prompts",
            "12", "--request-rate", "20", "--ignore-eos"]  # fmt: skip


@pytest.fixture
def profile_file(tmp_path):
    path = tmp_path / "hand.json"
    hand_profile(message_s=0.0005).save(path)
    return str(path)


def fails_with(argv: list[str], capsys=None) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    return str(exit_info.value.code)


def test_simulate_writes_vllm_bench_serves_keys(profile_file, tmp_path, capsys):
    out = tmp_path / "prediction.json"
    main(["simulate", "--profile", profile_file, "--num-prefill", "1", "--num-decode", "1", *WORKLOAD,
          "--metric-percentiles", "50,90,99", "--goodput", "tpot:500", "--result-json", str(out)])  # fmt: skip
    result = json.loads(out.read_text())
    assert result["completed"] == 12 and result["failed"] == 0 and result["total_output_tokens"] == 12 * 16
    for key in ("output_throughput", "median_ttft_ms", "p90_ttft_ms", "p99_tpot_ms", "p99_itl_ms", "request_goodput"):
        assert result[key] > 0, key
    printed = capsys.readouterr().out
    assert "1P+1D" in printed and "Output token throughput (tok/s)" in printed


def test_plan_recommends_a_spec_serve_takes_and_plots_goodput(profile_file, tmp_path, capsys):
    spec_path, plot_path = tmp_path / "best.yaml", tmp_path / "goodput.png"
    main(["plan", "--plan-profile", profile_file, "--max-devices", "3", "--slo", "ttft_p90=2s,tpot_p90=200ms",
          *WORKLOAD, "--output-spec", str(spec_path), "--plot", str(plot_path), "--plot-rates", "5,20"])  # fmt: skip
    printed = capsys.readouterr().out
    assert "| layout | devices |" in printed and "recommended" in printed
    spec = load_spec(spec_path)
    assert spec.decode.replicas >= 1 and spec.decode.num_gpus == 1
    assert plot_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("argv, named", [
    (["simulate", "--num-decode", "0"], "decode.replicas"),
    (["simulate", "--random-range-ratio", "2"], "--random-range-ratio"),
    (["plan", "--slo", "ttft_p90=1ms"], "--slo ttft_p90=1ms: even alone on an idle server"),
    (["plan", "--slo", "latency_p90=1s"], "--slo 'latency_p90=1s'"),
    (["plan", "--slo", "ttft_p90=2s", "--num-prefill", "1"], "--num-prefill"),
    (["plan", "--slo", "ttft_p90=2s", "--device", "tpu"], "unknown device 'tpu'"),
])  # fmt: skip
def test_bad_input_is_an_error_naming_the_field(profile_file, argv, named):
    flag = "--profile" if argv[0] == "simulate" else "--plan-profile"
    message = fails_with([*argv, flag, profile_file, *WORKLOAD])
    assert message.startswith("tandem: error:") and named in message


def test_a_malformed_trace_line_is_named(profile_file, tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 4}\n{"timestamp": 5, "input_length": -3}\n')
    message = fails_with(["simulate", "--profile", profile_file, "--trace", str(trace)])
    assert "trace.jsonl:2: input_length must be >= 1" in message


def test_a_profile_of_another_tensor_parallel_size_is_refused(profile_file):
    message = fails_with(["simulate", "--profile", profile_file, "-tp", "2", *WORKLOAD])
    assert "tensor_parallel_size is 2 but the profile" in message


def test_a_profile_is_described_with_its_serving_costs_measured_or_not():
    from cluster.plan_cli import describe_profile

    base = hand_profile()
    alone = dataclasses.replace(base, serving=dataclasses.replace(base.serving, alone_step_factor=0.97))
    assert "alone_step_factor" not in describe_profile(base)  # not measured: not said
    assert "alone_step_factor 0.97" in describe_profile(alone)


def test_profile_measures_and_calibrates_the_worker_of_the_knobs_given(monkeypatch, capsys):
    import planner.local_profile
    from cluster import plan_cli

    measured, calibrated = [], []
    monkeypatch.setattr(planner.local_profile, "local_profile",
                        lambda worker, refresh, on_progress: measured.append(worker) or hand_profile())  # fmt: skip
    monkeypatch.setattr(plan_cli, "calibrated",
                        lambda profile, model, limits, record_to: calibrated.append(limits) or profile)  # fmt: skip
    main(["profile", "--quantization", "none", "--max-num-batched-tokens", "512", "--torch-threads", "2", "--serving"])
    (worker,) = measured
    assert worker.torch_threads == 2 and worker.limits.quantization == "none"
    assert calibrated == [worker.limits] and worker.limits.max_num_batched_tokens == 512
