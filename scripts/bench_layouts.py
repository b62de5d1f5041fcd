"""Layouts side by side under one `vllm bench serve` load: does disaggregation pay on this machine, and do
cores of its own (`cluster.core_map`) keep a disaggregated decode stream from stalling?

Each layout is a real `tandem serve` (embedded local Ray, one at a time) driven by vLLM's own load generator
with the same flags and seed; reported per layout, from vLLM's result file: output tok/s, TTFT p50 / p99,
TPOT p50 / p99, ITL p99 and goodput (requests per second meeting TPOT <= the --goodput-tpot-ms).

Layouts: the default (one colocated worker on every core), 1 prefill + 1 decode worker on one core each,
pinned (the default for separate pools on one machine) and not (`--no-cpu-pinning`: every rank on every
core). Load: 16 prompts of 1,536 tokens arriving Poisson at 0.4/s, 200 output tokens each, `--ignore-eos`.

    python scripts/bench_layouts.py --markdown BENCHMARKS.md
    python scripts/bench_layouts.py --layouts "1P+1D pinned,1P+1D unpinned" --num-prompts 8   # a quick look
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from bench_loads import chosen_layout, tandem_serve, vllm_bench  # noqa: E402
from bench_report import add_markdown_option, machine_line, record_run, run_text  # noqa: E402

SPLIT = ("--num-prefill", "1", "--num-decode", "1", "--torch-threads", "1")
LAYOUTS = {
    "default": (),
    "1P+1D pinned": SPLIT,
    "1P+1D unpinned": (*SPLIT, "--no-cpu-pinning"),
}
COLUMNS = (("output_throughput", "out tok/s", 1), ("median_ttft_ms", "TTFT p50", 0), ("p99_ttft_ms", "TTFT p99", 0),
           ("median_tpot_ms", "TPOT p50", 1), ("p99_tpot_ms", "TPOT p99", 1), ("p99_itl_ms", "ITL p99", 0),
           ("request_goodput", "goodput req/s", 2))  # fmt: skip


def load_flags(num_prompts: int, goodput_tpot_ms: float) -> list[str]:
    return ["--dataset-name", "random", "--random-input-len", "1536", "--random-output-len", "200",
            "--request-rate", "0.4", "--num-prompts", str(num_prompts), "--ignore-eos",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
            "--goodput", f"tpot:{goodput_tpot_ms:g}"]  # fmt: skip


def core_lines(log: Path) -> list[str]:
    """Where `tandem serve` put the router and each worker rank ("<who> on cores <set>"), as they printed it."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text())  # Ray colours its workers' prefixes
    found = re.findall(r"tandem: (.+? on cores [0-9,]+)", text)
    return list(dict.fromkeys(found))


def table(results: dict[str, dict]) -> str:
    lines = ["| layout | completed | " + " | ".join(label for _, label, _ in COLUMNS) + " |",
             "|---|---|" + "---|" * len(COLUMNS)]  # fmt: skip
    for name, r in results.items():
        cells = [f"{r.get(key, float('nan')):.{digits}f}" for key, _, digits in COLUMNS]
        lines.append(f"| {name} | {r['completed']} of {r['num_prompts']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layouts", default=",".join(LAYOUTS), help=f"some of: {', '.join(LAYOUTS)}")
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--goodput-tpot-ms", type=float, default=60.0)
    p.add_argument("--seed", type=int, default=29)
    add_markdown_option(p)
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    from engine.model_source import resolve_model

    tokenizer, flags = str(resolve_model(None)), load_flags(args.num_prompts, args.goodput_tpot_ms)
    work = Path(tempfile.mkdtemp(prefix="bench-layouts-"))
    results, notes = {}, []
    for i, name in enumerate(args.layouts.split(",")):
        log = work / f"serve-{i}.log"
        with tandem_serve(None, log, flags=LAYOUTS[name]) as url:
            results[name] = vllm_bench(url, tokenizer, flags, args.seed, work / f"layout-{i}.json")
        notes.append(f"- `{name}`: `tandem serve {' '.join(LAYOUTS[name])}`".replace(" `", " `") + f"; layout: "
                     f"{chosen_layout(log)}" + "".join(f"; {line}" for line in core_lines(log)))  # fmt: skip
        print(f"{name}: {results[name]['completed']} completed", flush=True)
    text = table(results)
    print(text + f"\nresults: {work}")
    if args.markdown:
        details = (f"Load (`vllm bench serve`, the same seed for each layout): `{' '.join(flags)}`. "
                   "Layouts, as each started:\n" + "\n".join(notes))  # fmt: skip
        record_run(args.markdown, "bench_layouts.py", run_text("bench_layouts.py", sys.argv[1:], machine_line(),
                                                               details, text))  # fmt: skip


if __name__ == "__main__":
    main()
