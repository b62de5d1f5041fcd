"""Cluster sweeps: start Tandem configurations one after another and run scripts/bench_serving.py against each.

Four sweeps, one table each (plus vLLM's CPU build on the same model and loads with --with-vllm):
  mixed    disaggregated (1 prefill + 1 decode) against colocated (2 decode workers prefilling their own
           prompts) on long prompts interleaved with long outputs: TPOT p99 and goodput under an SLO;
  routing  cache_aware / least_loaded / round_robin with 2 prefill workers on shared system prompts:
           the prefix-cache hit rate (the server's /metrics), TTFT mean and p99;
  ratio    prefill:decode 1:1, 2:1, 1:2 at one request rate;
  serving  16 short prompts at once on 1P+1D, one colocated worker with 2 threads, 2 colocated workers.

    python scripts/bench_cluster.py --with-vllm --markdown BENCHMARKS.md        # the full run (~25 min, 2 cores)
    python scripts/bench_cluster.py --quick --model DIR --sweeps mixed          # seconds: the test's run

Beside each Tandem run, `tandem simulate`'s prediction of it (the same layout and load flags, priced by this
machine's cached profiles, their serving costs calibrated first: `cluster_bench.predict`), with its error.

Only one server is up at a time. Results (bench_serving JSON and plots per run, results.json, bar charts,
the Markdown section) go to --result-dir.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PEER_VLLM = ROOT.parent / "shared" / "tools" / "peer-vllm"  # sets vLLM's CPU build up once, prints its python
sys.path.insert(0, str(ROOT))  # the repository's packages (cluster, engine, router) for the Tandem servers
sys.path.insert(0, str(ROOT / "scripts"))
import bench_report  # noqa: E402
from cluster_bench import predict, report  # noqa: E402
from cluster_bench.servers import hit_rate_between, scrape_metrics, tandem_server, vllm_server  # noqa: E402
from cluster_bench.sweeps import FULL, QUICK, Config, Sweep, deployments, scaled, sweeps  # noqa: E402

def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="model directory or .gguf (default: the default model, SmolLM2-135M-Instruct)")
    p.add_argument("--quick", action="store_true", help="tiny loads (a smoke run: seconds with a tiny model)")
    p.add_argument("--sweeps", default="mixed,routing,ratio,serving", help="comma-separated of these four")
    p.add_argument("--rate-scale", type=float, default=1.0, help="multiply every request rate (busy machine: < 1)")
    p.add_argument("--with-vllm", action="store_true", help="also run every load against vLLM's CPU build")
    p.add_argument("--vllm-python", help="python of vLLM's virtualenv (default: ../shared/tools/peer-vllm's)")
    p.add_argument("--vllm-threads", type=int, default=2, help="cores vLLM's OpenMP binds (0..n-1)")
    p.add_argument("--max-model-len", type=int, help="default: the model's context, as tandem serve and vLLM take it")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048, help="chunked-prefill token budget per step")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--num-kv-blocks", type=int, help="Tandem KV blocks per worker (default: the engine's sizing)")
    p.add_argument("--no-predict", dest="predict", action="store_false", help="no tandem simulate beside the runs")
    p.add_argument("--no-calibrate", dest="calibrate", action="store_false",
                   help="predict with the cached profiles as they are (default: serving's costs measured first)")
    p.add_argument("--profile", help="price every prediction with this profile JSON (no calibration)")
    p.add_argument("--result-dir", help="default: bench_results/cluster-<date>")
    bench_report.add_markdown_option(p)
    args = p.parse_args(argv)
    args.sweep_names = tuple(s.strip() for s in args.sweeps.split(",") if s.strip())
    return args


def engine_knobs(args) -> dict:
    knobs = {"max_model_len": args.max_model_len, "max_num_batched_tokens": args.max_num_batched_tokens,
             "max_num_seqs": args.max_num_seqs, "num_kv_blocks": args.num_kv_blocks}  # fmt: skip
    return {k: v for k, v in knobs.items() if v is not None}  # not given: the engine's default


def bench(url: str, model: str, tokenizer: str, flags, out_dir: Path, name: str, label: str) -> dict:
    """One bench_serving.py run (its own process: the router's thread keeps this one's GIL) -> its result + hit rate."""
    before = scrape_metrics(url)
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_serving.py"), "--base-url", url, "--model", model,
           "--tokenizer", tokenizer, "--ignore-eos", "--percentile-metrics", "ttft,tpot,itl,e2el",
           "--metric-percentiles", "50,99", "--save-result", "--save-detailed", "--plot", "--result-dir", str(out_dir),
           "--result-filename", f"{name}.json", "--label", label, "--disable-tqdm", *flags]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"bench_serving failed against {label}:\n{done.stderr[-3000:]}")
    result = json.loads((out_dir / f"{name}.json").read_text())
    result["prefix_hit_rate"] = hit_rate_between(before, scrape_metrics(url))
    return result


def run_server(url: str, label: str, chosen: list[Sweep], args, out_dir: Path, rows: dict,
               config: Config | None = None) -> None:  # fmt: skip
    """Each sweep's load against the server at `url`; with a Tandem `config` (and --predict), the model's
    prediction of the same run beside it."""
    # No separate warm-up: bench_serving.py sends one request alone, uncounted, before every load.
    for sweep in chosen:
        print(f"[{_now()}] {sweep.name}: {label}", flush=True)
        name = f"{sweep.name}-{_slug(label)}"
        result = bench(url, args.served_name, args.model_dir, sweep.workload.flags, out_dir, name, label)
        if config is not None and args.predict:
            result["predicted"] = predict.predicted(config, sweep.workload, engine_knobs(args), args.model,
                                                    out_dir / f"{name}.predicted.json", args.profile)  # fmt: skip
        rows.setdefault(sweep.name, []).append({"config": label, **result})
        print(f"  {result['output_throughput']:.1f} out tok/s, TTFT mean {result['mean_ttft_ms']:.0f} ms, "
              f"TPOT p99 {result['p99_tpot_ms']:.1f} ms, goodput {result['request_goodput']}, "
              f"hit rate {result['prefix_hit_rate']}" + _predicted_text(result.get("predicted")), flush=True)  # fmt: skip


def _predicted_text(pred: dict | None) -> str:
    if not pred:
        return ""
    return (f"; predicted {pred['output_throughput']:.1f} out tok/s, TTFT mean {pred['mean_ttft_ms']:.0f} ms, "
            f"TPOT p99 {pred['p99_tpot_ms']:.1f} ms")  # fmt: skip


def calibrate_profiles(configs, args) -> None:
    """Serving's costs measured for each kind of worker the run starts (by its threads), before any run."""
    if not (args.predict and args.calibrate) or args.profile:
        return
    for config in {c.torch_threads: c for c in configs}.values():
        print(f"[{_now()}] calibrating the profile of {config.torch_threads}-thread workers", flush=True)
        predict.calibrate(config, args.model, engine_knobs(args))


def main(argv=None) -> dict:
    args = parse_args(argv)
    from cluster.deployment import connect_ray
    from engine.model_source import model_display_name, resolve_model

    started = time.monotonic()
    args.model_dir, args.served_name = str(resolve_model(args.model)), model_display_name(args.model)
    chosen = sweeps(scaled(QUICK if args.quick else FULL, args.rate_scale), args.sweep_names)
    out_dir = Path(args.result_dir or f"bench_results/cluster-{datetime.datetime.now():%Y%m%d-%H%M%S}")
    out_dir.mkdir(parents=True, exist_ok=True)
    load_before, engine = _uptime(), engine_knobs(args)
    rows: dict[str, list[dict]] = {}

    import ray

    plan = deployments(chosen)
    calibrate_profiles(plan, args)  # before this process's Ray: each calibration starts one of its own
    connect_ray(None)
    try:
        for config, its_sweeps in plan.items():
            print(f"[{_now()}] starting Tandem {config.label}", flush=True)
            with tandem_server(config, args.model, engine, args.served_name) as url:
                run_server(url, config.label, its_sweeps, args, out_dir, rows, config)
    finally:
        ray.shutdown()
    if args.with_vllm:
        print(f"[{_now()}] starting vLLM", flush=True)
        log = out_dir / "vllm_server.log"
        args.vllm_python = args.vllm_python or subprocess.run([str(PEER_VLLM)], capture_output=True, text=True,
                                                              check=True).stdout.strip()  # fmt: skip
        with vllm_server(args.vllm_python, args.model_dir, args.served_name, engine, args.vllm_threads, log) as url:
            run_server(url, f"vLLM CPU ({args.vllm_threads} cores)", chosen, args, out_dir, rows)
    elapsed = time.monotonic() - started
    lines = _header(args, argv, load_before, elapsed)
    for sweep in chosen:
        lines += ["", *report.section(sweep, rows[sweep.name], engine)]
        report.bar_chart(out_dir / f"{sweep.name}.png", sweep, rows[sweep.name])
    text = "\n".join(lines) + "\n"
    (out_dir / "results.json").write_text(json.dumps({"rows": rows, "engine": engine, "seconds": elapsed}))
    (out_dir / "tables.md").write_text(text)
    if args.markdown:
        bench_report.record_run(args.markdown, "bench_cluster.py", text)
    print(text)
    print(f"results in {out_dir} ({elapsed:.0f} s)")
    return rows


def _header(args, argv, load_before: str, elapsed: float) -> list[str]:
    command = "python scripts/bench_cluster.py " + " ".join(sys.argv[1:] if argv is None else argv)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    return [f"## Cluster sweeps (`scripts/bench_cluster.py`), {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
            "", f"`{command}` at commit {commit.stdout.strip() or '?'}, {elapsed:.0f} s in all.",
            f"Machine: {_cpu()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
            f"load average before / after: {load_before} / {_uptime()}.",
            f"Model: {args.served_name} (`{args.model_dir}`), float32. Tandem: one Ray actor per worker, "
            "each with its own torch threads as the configuration says, router in the benchmark's process; "
            "each load is its own bench_serving.py process. Prefix hit rate: prompt tokens found in a prefix "
            "cache over those looked up, from the server's /metrics: vLLM's counters over the run; for Tandem the "
            "mean of the prefill workers' own rates (`tandem:worker_prefix_cache_hit_rate`; the decode workers' "
            "when colocated) since they started, so a configuration's second load includes its first.",
            *([] if not args.predict else [_predictions_note(args)])]  # fmt: skip


def _predictions_note(args) -> str:
    priced = (f"the profile `{args.profile}`" if args.profile else "this machine's cached profiles, serving's costs "
              "calibrated at the start of the run (`tandem profile --serving` per thread count)" if args.calibrate
              else "this machine's cached profiles as they were")  # fmt: skip
    return (f"Predicted: `tandem simulate` with each run's layout and load flags, priced by {priced}; its "
            "error is predicted / measured - 1.")


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def _uptime() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _now() -> str:
    return datetime.datetime.now().strftime("%H:%M:%S")


def _slug(label: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in label).strip("_")


if __name__ == "__main__":
    main()
