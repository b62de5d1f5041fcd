"""`tandem profile`, `tandem simulate` and `tandem plan`: the performance model from the command line.

    tandem profile [--torch-threads N] [--dtype D] [--model M] [--refresh] [-o FILE]
    tandem profile --device h100 [-tp 2] [--model M] -o h100.json     (from published figures)
    tandem simulate [serve's layout flags | --config spec.yaml] [--profile FILE] \\
        --dataset-name random --random-input-len 1536 --random-output-len 200 --request-rate 0.4 \\
        --num-prompts 16 --ignore-eos [--result-json OUT]
    tandem plan ...  (`cluster.plan_command`)

`simulate` takes the layout as `serve` does (no layout flag: the layout `serve` would choose on this
machine) and the workload in `vllm bench serve`'s own flags, and writes the keys `vllm bench serve
--save-result` writes, so one argument string drives a real run and a prediction.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from cluster.cli import add_spec_flags, spec_from_args
from cluster.spec import QUANTIZATION_HELP, QUANTIZATIONS
from cluster.layout_profiles import ProfileFiles, layout_of

DEFAULT_PERCENTILE_METRICS = "ttft,tpot,itl"


def add_parsers(sub) -> None:
    p = sub.add_parser("profile", help="measure this machine's step costs (cached), or derive a device's from its figures")
    p.add_argument("--model", help="HF directory, .gguf file or hub id (default: SmolLM2-135M-Instruct); with --device "
                   "also a bare config.json")
    p.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"), default="auto")
    p.add_argument("--torch-threads", type=int, default=1, help="threads of the worker to profile (default 1)")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--quantization", choices=QUANTIZATIONS, default="auto", help=QUANTIZATION_HELP)
    p.add_argument("--device", help="a GPU known by its published figures (h100, h200, a100, l40s) instead of this machine")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1, help="with --device: GPUs per worker")
    p.add_argument("--price", type=float, help="with --device: price of one device-hour (a plan's goodput per dollar)")
    p.add_argument("--refresh", action="store_true", help="measure again even if a cached profile matches")
    p.add_argument("--serving", action="store_true",
                   help="then measure what serving adds (a real tandem serve of this worker kind; ~2 min) and cache it")
    p.add_argument("--output", "-o", help="also write the profile to this JSON file")
    p.add_argument("--json", action="store_true", help="print the profile as JSON")

    s = sub.add_parser("simulate", help="predict one layout under one workload (vllm bench serve's flags and result keys)")
    add_spec_flags(s)
    add_profile_flags(s)
    add_workload_flags(s)
    s.add_argument("--result-json", help="write the prediction here, with vllm bench serve's result keys")
    from cluster.plan_command import add_plan_parser

    add_plan_parser(sub)


def add_profile_flags(p) -> None:
    p.add_argument("--profile", help="profile JSON for every pool (default: this machine's, measured if not cached)")
    p.add_argument("--prefill-profile", help="profile JSON of the prefill pool's workers")
    p.add_argument("--decode-profile", help="profile JSON of the decode pool's workers")
    p.add_argument("--refresh-profile", action="store_true", help="measure this machine's profiles again")


def add_workload_flags(p) -> None:
    """`vllm bench serve`'s workload and metric flags, under its names and with its defaults."""
    w = p.add_argument_group("workload (vllm bench serve's flags)")
    w.add_argument("--dataset-name", default="random", choices=("random", "prefix_repetition"))
    w.add_argument("--num-prompts", type=int, default=1000)
    w.add_argument("--random-input-len", type=int, default=1024)
    w.add_argument("--random-output-len", type=int, default=128)
    w.add_argument("--random-range-ratio", type=float, default=0.0)
    w.add_argument("--random-prefix-len", type=int, default=0)
    w.add_argument("--prefix-repetition-prefix-len", type=int, default=256)
    w.add_argument("--prefix-repetition-suffix-len", type=int, default=256)
    w.add_argument("--prefix-repetition-num-prefixes", type=int, default=10)
    w.add_argument("--prefix-repetition-output-len", type=int, default=128)
    w.add_argument("--request-rate", type=float, default=math.inf)
    w.add_argument("--burstiness", type=float, default=1.0)
    w.add_argument("--max-concurrency", type=int)
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--ignore-eos", action="store_true")
    w.add_argument("--percentile-metrics", default=DEFAULT_PERCENTILE_METRICS)
    w.add_argument("--metric-percentiles", default="99")
    w.add_argument("--goodput", nargs="+", help="SLOs as ttft:MS tpot:MS e2el:MS (requests meeting all of them)")
    w.add_argument("--trace", help="JSON lines of requests (Mooncake's shape) instead of a generated dataset")


def workload_of(args: argparse.Namespace, vocab_size: int):
    from planner.trace import read_trace

    if args.trace:
        return read_trace(args.trace, vocab_size=vocab_size, seed=args.seed), ()
    spec = workload_spec(args)
    return spec.requests(vocab_size), spec.caveats


def workload_spec(args: argparse.Namespace):
    """The workload flags (vllm bench serve's) as a `planner.workload.WorkloadSpec`."""
    from planner.workload import WorkloadSpec

    return WorkloadSpec(args.dataset_name, args.num_prompts, args.random_input_len, args.random_output_len,
                        args.random_range_ratio, args.random_prefix_len, args.prefix_repetition_prefix_len,
                        args.prefix_repetition_suffix_len, args.prefix_repetition_num_prefixes,
                        args.prefix_repetition_output_len, args.request_rate, args.burstiness, args.max_concurrency,
                        args.seed, args.ignore_eos)  # fmt: skip


def metric_options(args: argparse.Namespace) -> tuple[dict, list[str], list[float]]:
    from planner.bench_metrics import parse_goodput

    metrics = [m.strip() for m in args.percentile_metrics.split(",") if m.strip()]
    try:
        percentiles = [float(p) for p in args.metric_percentiles.split(",") if p.strip()]
    except ValueError:
        raise ValueError(f"--metric-percentiles takes numbers like 50,90,99, got {args.metric_percentiles!r}") from None
    return parse_goodput(args.goodput), metrics, percentiles


def progress(what: str) -> None:
    print(f"tandem: profiling: {what}", file=sys.stderr, flush=True)


# ---- profile -------------------------------------------------------------------------
def run_profile(args: argparse.Namespace) -> None:
    if args.device:
        profile = published(args.device, args.model, args.tensor_parallel_size, args.price)
    else:
        from planner.layout import EngineLimits
        from planner.local_profile import LocalWorker, local_profile

        limits = EngineLimits(max_num_batched_tokens=args.max_num_batched_tokens, quantization=args.quantization)
        profile = local_profile(LocalWorker(args.model, args.dtype, args.torch_threads, limits), args.refresh,
                                on_progress=progress)  # fmt: skip
        if args.output:  # the evidence beside it: the steps it was fitted to, and what a calibration measured
            keep_samples(profile, evidence_path(args.output, "samples"))
        if args.serving:
            record_to = evidence_path(args.output, "calibration") if args.output else None
            profile = calibrated(profile, args.model, limits, record_to)
    if args.output:
        profile.save(args.output)
    print(json.dumps(profile.to_dict(), indent=1) if args.json else describe_profile(profile))


def evidence_path(output: str | Path, kind: str) -> Path:
    """Beside a profile written to `output` (x.json): x.samples.json, x.calibration.json."""
    return Path(output).with_suffix(f".{kind}.json")


def keep_samples(profile, path: Path) -> None:
    """A copy of the measured steps the cached `profile` was fitted to (`planner.local_profile.save_samples`)."""
    import shutil

    from planner.local_profile import samples_path

    cached = samples_path(profile.key)
    if cached.is_file():
        shutil.copyfile(cached, path)


def calibrated(profile, model: str | None, limits, record_to: Path | None = None):
    """`profile` with its serving costs measured on this machine (`cluster.serving_calibration`), on workers of
    the engine knobs it was measured with (`limits`), cached; what the calibration measured also written to
    `record_to`, when given."""
    from cluster.layout import Machines
    from cluster.serving_calibration import calibrate
    from planner.local_profile import engine_spec, store

    replicas = max(1, int(Machines.this_machine().local_cpus) // profile.torch_threads)
    profile = calibrate(profile, model, replicas, on_progress=progress, record_to=record_to,
                        engine=engine_spec(limits))  # fmt: skip
    store(profile)
    return profile


def published(device: str, model: str | None, tp_size: int, price: float | None):
    """A device's published profile for `model`: a model `serve` takes, or just its `config.json` (the sizes are
    all a datasheet profile needs: plan a model too large to hold here)."""
    from pathlib import Path

    from costmodel import ModelDims, published_profile
    from engine.model_source import resolve_model
    from planner.local_profile import model_dims

    if model and model.endswith(".json") and Path(model).is_file():
        dims = ModelDims.from_hf_config(json.loads(Path(model).read_text()), Path(model).stem)
    else:
        dims = model_dims(resolve_model(model))
    return published_profile(device, dims, tp_size, device_price_per_hour=price)


def describe_profile(profile) -> str:
    lines = [f"profile: {profile.label}", f"model: {profile.model.name}, {profile.dtype}",
             "step cost terms:"]  # fmt: skip
    lines += [f"  {name:30s} {value:.4g}" for name, value in profile.step.to_dict().items() if name != "kernel_bands"]
    if profile.step.kernel_bands:
        lines.append(f"  {'kernel_bands':30s} {profile.step.describe_kernel_bands()}")
    lines.append(f"KV transfer: {profile.transfer.latency_s * 1e3:.2f} ms + {profile.transfer.bytes_per_s / 1e9:.2f} GB/s")
    lines.append(f"KV capacity per worker: {profile.kv_cache_tokens} tokens ({profile.kv_bytes_per_token} B/token)")
    lines.append("serving: " + ", ".join(f"{k} {v:.4g}" for k, v in profile.serving.to_dict().items() if v is not None))
    if profile.fit:
        f = profile.fit
        lines.append(f"fit over {f.points} measured steps: |error| median {f.median_abs_error:.1%}, p90 "
                     f"{f.p90_abs_error:.1%}, max {f.max_abs_error:.1%}; worst:")  # fmt: skip
        lines += [f"  {shape}: measured {m * 1e3:.1f} ms, predicted {p * 1e3:.1f} ms" for shape, m, p in f.worst]
    lines += [f"note: {note}" for note in profile.notes]
    return "\n".join(lines)


# ---- simulate -------------------------------------------------------------------------
def run_simulate(args: argparse.Namespace) -> None:
    from planner.sim.run import simulate

    layout, why = layout_for(args)
    requests, caveats = workload_of(args, layout.decode.profile.model.vocab_size)
    slos, metrics, percentiles = metric_options(args)
    result = simulate(layout, requests, args.max_concurrency if not args.trace else None)
    bench = result.bench_result(slos, metrics, percentiles)
    print(f"tandem: layout: {layout.describe()} ({why})")
    for caveat in caveats:
        print(f"tandem: note: {caveat}")
    print(summary(bench, metrics, percentiles))
    print(f"simulated {result.steps} steps in {result.wall_s:.2f} s ({result.steps / max(result.wall_s, 1e-9):,.0f} "
          "steps/s)")  # fmt: skip
    if args.result_json:
        with open(args.result_json, "w") as f:
            json.dump({**bench, "layout": layout.describe(), "simulated": True}, f, indent=1)


def layout_for(args: argparse.Namespace):
    """The layout of the spec and flags, as `serve` would choose it here when they name none."""
    from cluster.layout import Machines, choose_layout

    spec, why = choose_layout(spec_from_args(args), Machines.this_machine())
    files = ProfileFiles(args.profile, args.prefill_profile, args.decode_profile)
    return layout_of(spec, files, args.refresh_profile, on_progress=progress), why


def summary(bench: dict, metrics: list[str], percentiles: list[float]) -> str:
    """The figures `vllm bench serve` prints, from its result keys."""
    from planner.bench_metrics import percentile_key

    rows = [("Successful requests", bench["completed"]), ("Failed requests", bench["failed"]),
            ("Benchmark duration (s)", bench["duration"]), ("Request throughput (req/s)", bench["request_throughput"]),
            ("Output token throughput (tok/s)", bench["output_throughput"])]  # fmt: skip
    if bench.get("request_goodput") is not None:
        rows.append(("Request goodput (req/s)", bench["request_goodput"]))
    for metric in metrics:
        rows += [(f"Mean {metric.upper()} (ms)", bench[f"mean_{metric}_ms"]),
                 (f"Median {metric.upper()} (ms)", bench[f"median_{metric}_ms"])]  # fmt: skip
        rows += [(f"P{p:g} {metric.upper()} (ms)", bench[percentile_key(metric, p)]) for p in percentiles]
    return "\n".join(f"{name:40s} {value:>12.2f}" if isinstance(value, float) else f"{name:40s} {value:>12}"
                     for name, value in rows)  # fmt: skip
