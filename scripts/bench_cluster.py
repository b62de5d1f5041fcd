"""Cluster sweeps: start Tandem configurations one after another and run scripts/bench_serving.py against each.

Four sweeps, one table each (plus vLLM's CPU build on the same model and loads with --with-vllm):
  mixed    disaggregated (1 prefill + 1 decode) against colocated (2 decode workers prefilling their own
           prompts) on long prompts interleaved with long outputs: TPOT p99 and goodput under an SLO;
  routing  cache_aware / least_loaded / round_robin with 2 prefill workers on shared system prompts:
           the prefix-cache hit rate (the server's /metrics), TTFT mean and p99;
  ratio    prefill:decode 1:1, 2:1, 1:2 at one request rate;
  serving  16 short prompts at once on 1P+1D, one colocated worker with 2 threads, 2 colocated workers.

    python scripts/bench_cluster.py --with-vllm --markdown BENCHMARKS.md        # the full run (~15 min, 2 cores)
    python scripts/bench_cluster.py --quick --model DIR --sweeps mixed          # seconds: the test's run

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
sys.path.insert(0, str(ROOT))  # the repository's packages (cluster, engine, router) for the Tandem servers
sys.path.insert(0, str(ROOT / "scripts"))
import bench_report  # noqa: E402
from cluster_bench import report  # noqa: E402
from cluster_bench.servers import hit_rate_between, scrape_metrics, tandem_server, vllm_server  # noqa: E402
from cluster_bench.sweeps import FULL, QUICK, Sweep, deployments, scaled, sweeps  # noqa: E402

def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="model directory or .gguf (default: the default model, SmolLM2-135M-Instruct)")
    p.add_argument("--quick", action="store_true", help="tiny loads (a smoke run: seconds with a tiny model)")
    p.add_argument("--sweeps", default="mixed,routing,ratio,serving", help="comma-separated of these four")
    p.add_argument("--rate-scale", type=float, default=1.0, help="multiply every request rate (busy machine: < 1)")
    p.add_argument("--with-vllm", action="store_true", help="also run every load against vLLM's CPU build")
    p.add_argument("--vllm-python", default="/work/vllm-venv/bin/python", help="python of vLLM's virtualenv")
    p.add_argument("--vllm-threads", type=int, default=2, help="cores vLLM's OpenMP binds (0..n-1)")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048, help="chunked-prefill token budget per step")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--num-kv-blocks", type=int, help="Tandem KV blocks per worker (default: the engine's sizing)")
    p.add_argument("--result-dir", help="default: bench_results/cluster-<date>")
    bench_report.add_markdown_option(p)
    args = p.parse_args(argv)
    args.sweep_names = tuple(s.strip() for s in args.sweeps.split(",") if s.strip())
    return args


def engine_knobs(args) -> dict:
    knobs = {"max_model_len": args.max_model_len, "max_num_batched_tokens": args.max_num_batched_tokens,
             "max_num_seqs": args.max_num_seqs}  # fmt: skip
    if args.num_kv_blocks:
        knobs["num_kv_blocks"] = args.num_kv_blocks
    return knobs


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


def run_server(url: str, label: str, chosen: list[Sweep], args, out_dir: Path, rows: dict) -> None:
    # No separate warm-up: bench_serving.py sends one request alone, uncounted, before every load.
    for sweep in chosen:
        print(f"[{_now()}] {sweep.name}: {label}", flush=True)
        result = bench(url, args.served_name, args.model_dir, sweep.workload.flags, out_dir,
                       f"{sweep.name}-{_slug(label)}", label)  # fmt: skip
        rows.setdefault(sweep.name, []).append({"config": label, **result})
        print(f"  {result['output_throughput']:.1f} out tok/s, TTFT mean {result['mean_ttft_ms']:.0f} ms, "
              f"TPOT p99 {result['p99_tpot_ms']:.1f} ms, goodput {result['request_goodput']}, "
              f"hit rate {result['prefix_hit_rate']}", flush=True)  # fmt: skip


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

    connect_ray(None)
    try:
        for config, its_sweeps in deployments(chosen).items():
            print(f"[{_now()}] starting Tandem {config.label}", flush=True)
            with tandem_server(config, args.model, engine, args.served_name) as url:
                run_server(url, config.label, its_sweeps, args, out_dir, rows)
    finally:
        ray.shutdown()
    if args.with_vllm:
        print(f"[{_now()}] starting vLLM", flush=True)
        log = out_dir / "vllm_server.log"
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
            "when colocated) since they started, so a configuration's second load includes its first."]  # fmt: skip


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
