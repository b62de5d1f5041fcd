"""The performance model's prediction beside each measured run: `tandem simulate` of the same layout and load.

A sweep's configuration becomes `tandem serve`'s layout flags, its workload's bench_serving.py flags are
`vllm bench serve`'s and so `tandem simulate`'s (one spelling differs: the dataset `prefix-repetition`), and
the prediction comes back under the same result keys as the measurement. It prices the run with this
machine's cached profile of the configuration's workers, as a user's `tandem simulate` would; calibrated
first (`calibrate`: `tandem profile --serving`, serving's own costs measured on a real deployment) where the
run asks for it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .sweeps import Config, Workload

ROOT = Path(__file__).resolve().parents[2]
# bench_serving.py's keys that the table sets side by side (vllm bench serve's, which `simulate` writes too)
COMPARED = (("mean_ttft_ms", "TTFT mean"), ("p99_ttft_ms", "TTFT p99"), ("median_tpot_ms", "TPOT p50"),
            ("p99_tpot_ms", "TPOT p99"), ("output_throughput", "out tok/s"), ("request_goodput", "goodput"))  # fmt: skip
METRIC_FLAGS = ("--ignore-eos", "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99")
_DATASET_NAMES = {"prefix-repetition": "prefix_repetition"}  # bench_serving.py's spelling -> simulate's


def layout_flags(config: Config, engine: dict) -> tuple[str, ...]:
    """`tandem serve`'s flags for `config` with the run's engine knobs (those given: None is the default)."""
    flags = ["--num-prefill", str(config.num_prefill), "--num-decode", str(config.num_decode),
             "--torch-threads", str(config.torch_threads), "--routing-policy", config.routing_policy]  # fmt: skip
    for knob, value in engine.items():
        if value is not None:
            flags += [f"--{knob.replace('_', '-')}", str(value)]
    return tuple(flags)


def workload_flags(workload: Workload) -> tuple[str, ...]:
    """The workload's bench_serving.py flags as `tandem simulate` takes them."""
    flags = list(workload.flags)
    for i, flag in enumerate(flags[:-1]):
        if flag == "--dataset-name":
            flags[i + 1] = _DATASET_NAMES.get(flags[i + 1], flags[i + 1])
    return tuple(flags)


def calibrate(config: Config, model: str | None, engine: dict) -> None:
    """This machine's profile of `config`'s workers measured if not cached, with serving's costs measured now
    (a real deployment of that worker kind, a few minutes), and cached for `predicted`. A profile is cached
    per engine knobs, and `tandem profile` takes only the chunk budget and the quantization: with other knobs
    given, `predicted` measures a profile of its own, uncalibrated."""
    flags = ["--model", model] if model else []
    for knob in ("max_num_batched_tokens", "quantization"):
        if engine.get(knob):
            flags += [f"--{knob.replace('_', '-')}", str(engine[knob])]
    tandem_cli(["profile", "--serving", "--torch-threads", str(config.torch_threads), *flags], "tandem profile --serving")


def predicted(config: Config, workload: Workload, engine: dict, model: str | None, out: Path,
              profile: str | None = None) -> dict:  # fmt: skip
    """`tandem simulate`'s result for `config` under `workload` (vllm bench serve's keys), written to `out`;
    priced with `profile` (a file) or this machine's cached profiles."""
    model_flags = ["--model", model] if model else []
    profile_flags = ["--profile", profile] if profile else []
    tandem_cli(["simulate", *layout_flags(config, engine), *model_flags, *workload_flags(workload), *METRIC_FLAGS,
                *profile_flags, "--result-json", str(out)], f"tandem simulate on {workload.name} ({config.label})")  # fmt: skip
    return json.loads(out.read_text())


def tandem_cli(args: list[str], what: str, timeout_s: float | None = None) -> None:
    """`tandem ARGS` from this tree (the benchmarks' profile, calibration and simulation runs); its error's tail
    raised when it fails."""
    done = subprocess.run([sys.executable, "-m", "cluster.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout_s)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed: {done.stderr[-2000:]}")


def error(pred: float | None, real: float | None) -> float | None:
    """The prediction's relative error (None where either is missing or the measurement is 0)."""
    if pred is None or not real:
        return None
    return pred / real - 1
