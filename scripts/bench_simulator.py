"""How far the simulator plans past this machine: one simulated hour of a trace at 20 requests/s on 64 GPU
workers, timed on one core, in simulated engine steps per second.

The trace is Mooncake-shaped (`planner.trace`): Poisson arrivals at `--rate`, prompts of 512-token blocks
of which the first few repeat across requests (system prompts: the prefix caches and cache-aware routing
have work), lognormal input and output lengths. The layout: `--prefill` + `--decode` workers of
`--device` (published figures) at tp 1, or `--colocated` workers.

    python scripts/bench_simulator.py --markdown BENCHMARKS.md
    python scripts/bench_simulator.py --seconds 60               # a minute of it
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from bench_report import add_markdown_option, machine_line, record_run, run_text  # noqa: E402


def write_trace(path: Path, seconds: float, rate: float, seed: int = 0) -> int:
    """Requests of `seconds` at `rate`: inputs ~ lognormal (median 2k tokens), outputs ~ lognormal (median 200);
    the first 1-3 blocks from one of 64 shared prefixes half of the time."""
    rng = np.random.default_rng(seed)
    count = int(seconds * rate)
    arrivals = np.cumsum(rng.exponential(1 / rate, count)) * 1000
    inputs = np.clip(rng.lognormal(np.log(2000), 0.7, count), 64, 30000).astype(int)
    outputs = np.clip(rng.lognormal(np.log(200), 0.8, count), 8, 2000).astype(int)
    with open(path, "w") as f:
        for i in range(count):
            blocks = -(-inputs[i] // 512)
            shared = int(rng.integers(1, 4)) if rng.random() < 0.5 else 0
            prefix = [int(rng.integers(0, 64)) * 8 + b for b in range(min(shared, blocks))]
            own = list(range(1_000_000 + i * 64, 1_000_000 + i * 64 + blocks - len(prefix)))
            f.write(json.dumps({"timestamp": round(float(arrivals[i]), 1), "input_length": int(inputs[i]),
                                "output_length": int(outputs[i]), "hash_ids": prefix + own}) + "\n")  # fmt: skip
    return count


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=3600.0, help="simulated seconds of trace")
    p.add_argument("--rate", type=float, default=20.0)
    p.add_argument("--device", default="h100")
    p.add_argument("--prefill", type=int, default=16)
    p.add_argument("--decode", type=int, default=48)
    p.add_argument("--model-config", default=str(ROOT / "docs" / "models" / "llama-3.1-8b.json"),
                   help="config.json of the model to simulate")
    add_markdown_option(p)
    args = p.parse_args(argv)
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core, as the target says

    from costmodel import ModelDims, published_profile
    from planner.layout import Layout, PoolLayout
    from planner.sim.run import simulate
    from planner.trace import read_trace

    dims = ModelDims.from_hf_config(json.loads(Path(args.model_config).read_text()), Path(args.model_config).stem)
    profile = published_profile(args.device, dims)
    layout = Layout(PoolLayout(args.prefill, profile), PoolLayout(args.decode, profile))
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.jsonl"
        count = write_trace(trace, args.seconds, args.rate)
        started = time.perf_counter()
        requests = read_trace(trace, vocab_size=dims.vocab_size)
        read_s = time.perf_counter() - started
    result = simulate(layout, requests)
    bench = result.bench_result(percentiles=[50, 90, 99])
    rows = [
        "| simulated | requests | workers | wall s (trace read + simulation) | engine steps | steps/s | events/s | "
        "completed | TTFT p50 / p99 ms | TPOT p50 / p99 ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
        f"| {args.seconds:.0f} s at {args.rate:g} req/s | {count} | {layout.describe()} | {read_s:.1f} + "
        f"{result.wall_s:.1f} | {result.steps:,} | {result.steps / result.wall_s:,.0f} | "
        f"{result.events / result.wall_s:,.0f} | {bench['completed']} | {bench['median_ttft_ms']:.0f} / "
        f"{bench['p99_ttft_ms']:.0f} | {bench['median_tpot_ms']:.1f} / {bench['p99_tpot_ms']:.1f} |",
    ]  # fmt: skip
    text = "\n".join(rows)
    print(text)
    if args.markdown:
        details = (f"Model: {dims.name} ({args.model_config}), {args.device} from published figures "
                   "(costmodel.devices), tp 1; one core (sched_setaffinity). Trace: Mooncake-shaped, Poisson "
                   "arrivals, lognormal lengths (input median 2,000, output median 200), half the prompts starting "
                   "with one of 64 shared prefixes of 1-3 blocks of 512 tokens.")  # fmt: skip
        record_run(args.markdown, "bench_simulator.py", run_text("bench_simulator.py", sys.argv[1:], machine_line(),
                                                                  details, text))  # fmt: skip


if __name__ == "__main__":
    main()
