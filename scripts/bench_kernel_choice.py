"""Decode steps by batch size, the linear kernels chosen on cold weights against warm ones, in one run.

A worker times its linear kernels at its first start on a machine (`engine.layers.linear_choice`). Until
b0d4e5a it timed them on one layer's weights read again and again, warm in the cache; now on copies of the
layer past twice the last-level cache, read from memory as a decode step reads them
(`engine.layers.cold_weights`). For each dtype and thread count each variant times its choice anew, in a
cache folder of its own (`warm`: `cold_weights.MAX_COPIES = 1`, the one layer as before), then runs the
default model's offline decode steps of 1, 2, 3, 4, 8 and 16 rows (`engine.LLM`, greedy, 64 tokens after a
4-token prompt per row; the best of 3 generations). The variants take turns in fresh processes,
`--repeats` times (the later ones read their variant's cached choice), and each row count keeps its best:
processes running the same kernels differ by up to ~15% here.

    python scripts/bench_kernel_choice.py --markdown BENCHMARKS.md
    python scripts/bench_kernel_choice.py --dtypes float32 --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from bench_report import add_markdown_option, machine_line, record_run, run_text  # noqa: E402

VARIANTS = ("warm", "cold")
STEPS = 64


def measure(variant: str, dtype: str, threads: int, rows: list[int]) -> dict:
    """In this process: the choice timed `variant`'s way, then the best step time (ms) per row count."""
    import torch

    torch.set_num_threads(threads)
    if variant == "warm":
        from engine.layers import cold_weights

        cold_weights.MAX_COPIES = 1  # one copy of the layer, read again and again: the timing before b0d4e5a
    from engine import LLM, SamplingParams

    llm = LLM(model=None, dtype=dtype, num_kv_blocks=256)
    ms = {}
    for count in rows:
        prompts = [[1, 2, 3, 4 + i] for i in range(count)]
        llm.generate(prompts, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True), use_tqdm=False)
        params = SamplingParams(max_tokens=STEPS + 1, temperature=0, ignore_eos=True)  # the first token: prefill
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            llm.generate(prompts, params, use_tqdm=False)
            best = min(best, time.perf_counter() - start)
        ms[count] = best / STEPS * 1000
    return {"ops": llm.engine.runner.model.ops.name, "ms": ms}


def measured(variant: str, dtype: str, threads: int, rows: list[int], cache: str) -> dict:
    """`measure` in a fresh process whose kernel choice is cached in `cache` (timed by the first, read by the rest)."""
    argv = [sys.executable, __file__, "--measure", variant, "--dtypes", dtype, "--threads", str(threads),
            "--rows", ",".join(map(str, rows))]  # fmt: skip
    out = subprocess.run(argv, env={**os.environ, "TANDEM_CACHE_DIR": cache}, capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    return json.loads(out.strip().splitlines()[-1])


def gguf_choice(ops: str) -> str:
    """The quantized bands of an ops description (what the GGUF model's linears run), else the dense ones."""
    return ops.split("GGUF blocks by rows: ")[-1] if "GGUF blocks by rows: " in ops else ops


def kernels_at(choice: str, rows: int) -> str:
    """The kernel of each weight type at `rows` in a `gguf_choice` ("Q4_1: 1 row: blocks, 2-4 rows: ...; Q8_0: ...")."""
    from engine.layers.linear_choice import band_of

    band = band_of(rows)
    return "; ".join(f"{qtype}: {bands.split(', ')[band].split(': ')[1]}"
                     for qtype, bands in re.findall(r"(Q\w+): (.*?)(?:;|$)", choice))  # fmt: skip


def best_of(runs: list[dict]) -> dict:
    """The fastest step per row count over runs of one variant (processes differ by a few % on the same kernels)."""
    return {"ops": runs[0]["ops"], "ms": {r: min(run["ms"][r] for run in runs) for r in runs[0]["ms"]}}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtypes", default="auto", help="auto: what `tandem serve` takes on this CPU; or float32,bfloat16")
    p.add_argument("--threads", default="1,2", help="torch threads, each a worker's")
    p.add_argument("--rows", default="1,2,3,4,8,16", help="decode batch sizes")
    p.add_argument("--repeats", type=int, default=2, help="processes per variant, taking turns; the best step kept")
    p.add_argument("--measure", choices=VARIANTS, help=argparse.SUPPRESS)  # the child process's part
    add_markdown_option(p)
    args = p.parse_args(argv)
    rows = [int(r) for r in args.rows.split(",")]
    if args.measure:
        print(json.dumps(measure(args.measure, args.dtypes, int(args.threads), rows)))
        return
    from cluster_bench.servers import peer_dtype

    dtypes = [peer_dtype() if d == "auto" else d for d in args.dtypes.split(",")]
    lines, choices = ["| dtype | threads | " + " | ".join(f"{r} rows: warm / cold ms" for r in rows) + " |",
                      "|---|---|" + "---|" * len(rows)], []  # fmt: skip
    for dtype in dtypes:
        for threads in (int(t) for t in args.threads.split(",")):
            runs = {v: [] for v in VARIANTS}
            with tempfile.TemporaryDirectory() as warm_cache, tempfile.TemporaryDirectory() as cold_cache:
                caches = {"warm": warm_cache, "cold": cold_cache}  # each variant's choice timed once, anew
                for _ in range(args.repeats):  # the variants take turns: a slow minute of the VM slows both
                    for variant in VARIANTS:
                        runs[variant].append(measured(variant, dtype, threads, rows, caches[variant]))
            warm, cold = best_of(runs["warm"]), best_of(runs["cold"])
            cells = []
            for r in rows:
                w, c = warm["ms"][str(r)], cold["ms"][str(r)]
                moved = kernels_at(gguf_choice(warm["ops"]), r) != kernels_at(gguf_choice(cold["ops"]), r)
                cells.append(f"{w:.1f} / {c:.1f}" + (f" **{c / w - 1:+.0%}**" if moved else ""))
            lines.append(f"| {dtype} | {threads} | " + " | ".join(cells) + " |")
            choices += [f"- {dtype}, {threads} thread(s), {v}: {gguf_choice(best['ops'])}"
                        for v, best in (("warm", warm), ("cold", cold))]  # fmt: skip
            print(lines[-1], flush=True)
    table = "\n".join(lines) + "\n\nThe kernels each chose (the default model's GGUF blocks by rows):\n\n" + "\n".join(choices)
    print(table)
    if args.markdown:
        import torch

        details = (f"SmolLM2-135M-Instruct (the default model, in its GGUF blocks), offline `engine.LLM`; a step is the "
                   f"best of 3 generations of {STEPS} tokens per row over {STEPS}. Bold: "
                   "where the row count's band chose another kernel cold than warm; elsewhere both ran the same kernels, and the\n"
                   f"difference is the processes' (the best of {args.repeats} each, taking turns).\n")  # fmt: skip
        record_run(args.markdown, "bench_kernel_choice.py", run_text("bench_kernel_choice.py", sys.argv[1:],
                   machine_line(f"torch {torch.__version__}"), details, table))  # fmt: skip


if __name__ == "__main__":
    main()
