"""Tensor-parallel engine against tp_size 1, same machine, same run.

A random-weight Llama of a chosen size (no download: built with transformers
from a config and saved as safetensors into a temp dir) serves one workload:
`--batch` requests of `--prompt-len` random tokens, `--output-len` greedy
tokens each (EOS ignored), all queued at once; one untimed run, then the best
(and median) of `--repeats` timed runs with fresh prompts of the same shapes. tp=1 runs first in this process
with `tp * --threads` torch threads; then rank 0 runs here and ranks 1..tp-1 in
spawned processes (gloo over loopback), each with `--threads` threads, so both
use the same cores. Rank 0's greedy tokens must equal tp=1's.

    python scripts/bench_tp.py --tp 2 --markdown BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import socket
import statistics
import sys
import tempfile
from pathlib import Path

import torch
import torch.multiprocessing as mp

import bench_report
from bench_engine import Result, Workload, machine_info, run_tandem
from engine import LLM, EngineArgs
from engine.parallel.follower import TPFollower


def build_model(out_dir: Path, args) -> str:
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=32000, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        max_position_embeddings=2048, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(out_dir, safe_serialization=True)
    return str(out_dir)


def engine_kwargs(args) -> dict:
    return dict(dtype=args.dtype, num_kv_blocks=args.kv_blocks, max_model_len=2048)


def run_follower(rank: int, model_dir: str, tp: int, addr: str, kwargs: dict, threads: int) -> None:
    torch.set_num_threads(threads)
    engine_args = EngineArgs(model=model_dir, tensor_parallel_size=tp, tensor_parallel_rank=rank, dist_init_addr=addr, **kwargs)
    TPFollower(engine_args.create_engine_config()).run()


def make_workload(args, seed: int) -> Workload:
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 32000) for _ in range(args.prompt_len)] for _ in range(args.batch)]
    return Workload(f"seed {seed}", "", prompts, [args.output_len] * args.batch)


def bench(llm: LLM, args, label: str) -> list[Result]:
    """One untimed run, then `--repeats` timed runs; each run has fresh prompts of the same shapes
    (no prefix-cache hits). The first run in a process pays one-off costs (kernel selection for
    new shapes, page faults); repeats show how much other work on the machine moved the numbers."""
    run_tandem(llm, make_workload(args, seed=1000), progress=False)
    results = [run_tandem(llm, make_workload(args, seed), progress=False) for seed in range(args.repeats)]
    for r in results:
        r.engine = label
    return results


def bench_tp(model_dir: str, args) -> list[Result]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        addr = f"127.0.0.1:{s.getsockname()[1]}"
    ctx = mp.get_context("spawn")
    followers = [
        ctx.Process(target=run_follower, args=(r, model_dir, args.tp, addr, engine_kwargs(args), args.threads))
        for r in range(1, args.tp)
    ]
    for p in followers:
        p.start()
    torch.set_num_threads(args.threads)
    llm = LLM(model_dir, skip_tokenizer_init=True, tensor_parallel_size=args.tp, dist_init_addr=addr, **engine_kwargs(args))
    try:
        return bench(llm, args, f"tp={args.tp}")
    finally:
        llm.engine.shutdown()
        for p in followers:
            p.join(timeout=60)


def markdown(args, runs: dict[str, list[Result]], same_tokens: bool) -> str:
    best = {label: min(results, key=lambda r: r.wall_s) for label, results in runs.items()}
    base = best["tp=1"]
    rows = [
        f"| {label} | {r.output_tokens} | {r.wall_s:.2f} | {statistics.median(x.wall_s for x in runs[label]):.2f} | "
        f"{r.tok_s:.1f} | {r.mean_step_ms:.2f} | {r.tok_s / base.tok_s:.2f}x |"
        for label, r in best.items()
    ]
    m = machine_info()
    return "\n".join([
        f"\n## Tensor parallel on CPU (`scripts/bench_tp.py`), {datetime.datetime.now():%Y-%m-%d %H:%M}\n",
        f"- Command: `python {' '.join(sys.argv)}`",
        f"- Machine: {m['cpu']} ({bench_report.instruction_set()}), {m['cores']} cores, torch {m['torch']}; "
        f"tp=1 with {args.tp * args.threads} threads, "
        f"each tp rank {args.threads}; load average before the run {LOAD_BEFORE}, after {os.getloadavg()[0]:.2f}",
        f"- Model: random Llama, hidden {args.hidden}, {args.layers} layers, {args.heads} heads / {args.kv_heads} KV heads, "
        f"intermediate {args.intermediate}, {args.dtype}",
        f"- Workload: {args.batch} requests x {args.prompt_len} prompt tokens, {args.output_len} output tokens, greedy; "
        f"best of {args.repeats} runs after one warm-up run",
        f"- Greedy tokens of tp={args.tp} equal tp=1: {same_tokens}\n",
        "| engine | output tokens | best wall s | median wall s | output tok/s (best) | mean step ms (best) | vs tp=1 |",
        "|---|---|---|---|---|---|---|",
        *rows, "",
    ])


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch threads per tp rank")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--intermediate", type=int, default=2816)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--kv-blocks", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3, help="timed runs per engine (best and median reported)")
    bench_report.add_markdown_option(p)
    return p.parse_args(argv)


LOAD_BEFORE = f"{os.getloadavg()[0]:.2f}"  # other work on the machine skews both rows


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model(Path(tmp), args)
        torch.set_num_threads(args.tp * args.threads)
        single = bench(LLM(model_dir, skip_tokenizer_init=True, **engine_kwargs(args)), args, "tp=1")
        parallel = bench_tp(model_dir, args)
    tokens = lambda results: [r.extra["first_output_token_ids"] for r in results]  # noqa: E731
    section = markdown(args, {"tp=1": single, f"tp={args.tp}": parallel}, tokens(single) == tokens(parallel))
    print(section)
    if args.markdown:
        bench_report.record_run(args.markdown, "bench_tp.py", section)


if __name__ == "__main__":
    main()
