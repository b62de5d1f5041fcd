"""Prefill throughput by chunk size: Tandem's engine against transformers' forward, the same prompts.

One prompt of N tokens at a time (N up to the default batched-token budget, 2048: one chunk), prefix
caching off, greedy, one output token; Tandem runs `engine.step()` until the request finishes,
transformers one forward over the prompt (logits for the last position only, as generation computes
them). Prompt tokens per second, the median of `--repeats` runs, each with a fresh random prompt.

    python scripts/bench_prefill.py --markdown BENCHMARKS.md
    python scripts/bench_prefill.py --dtype float32 --sizes 64,512
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from bench_report import add_markdown_option, machine_line, record_run, run_text  # noqa: E402
from cluster_bench.servers import peer_dtype  # noqa: E402


def prompts(vocab: int, size: int, count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab) for _ in range(size)] for _ in range(count)]


def tandem_times(llm, batch: list[list[int]]) -> list[float]:
    from engine import SamplingParams

    engine, params, times = llm.engine, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True), []
    for i, prompt in enumerate(batch):
        engine.add_request(f"p{len(prompt)}-{i}", prompt, params)
        start = time.perf_counter()
        while engine.has_unfinished_requests():
            engine.step()
        times.append(time.perf_counter() - start)
    return times


@torch.inference_mode()
def hf_times(model, batch: list[list[int]]) -> list[float]:
    times = []
    for prompt in batch:
        start = time.perf_counter()
        model(torch.tensor([prompt]), use_cache=False, logits_to_keep=1)
        times.append(time.perf_counter() - start)
    return times


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", default="auto", help="auto: what `tandem serve` takes on this CPU")
    p.add_argument("--sizes", default="32,128,512,1024,2048", help="prompt lengths (tokens)")
    p.add_argument("--repeats", type=int, default=3)
    add_markdown_option(p)
    args = p.parse_args(argv)
    dtype = peer_dtype() if args.dtype == "auto" else args.dtype
    from transformers import AutoModelForCausalLM

    from engine import LLM
    from engine.model_source import resolve_model

    model_dir = str(resolve_model(None))
    llm = LLM(model=None, dtype=dtype, max_model_len=4096, enable_prefix_caching=False)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    vocab = hf.config.vocab_size
    tandem_times(llm, prompts(vocab, 64, 2, seed=0))  # warm up
    hf_times(hf, prompts(vocab, 64, 2, seed=0))
    rows = ["| prompt tokens | Tandem prompt tok/s | transformers prompt tok/s | Tandem / transformers |",
            "|---|---|---|---|"]  # fmt: skip
    for size in (int(s) for s in args.sizes.split(",")):
        batch = prompts(vocab, size, args.repeats, seed=size)
        ours, theirs = (size / statistics.median(f(m, batch)) for f, m in ((tandem_times, llm), (hf_times, hf)))
        rows.append(f"| {size} | {ours:.0f} | {theirs:.0f} | {ours / theirs:.2f}x |")
        print(rows[-1], flush=True)
    table = "\n".join(rows)
    if args.markdown:
        details = (f"SmolLM2-135M-Instruct in {dtype}, torch threads {torch.get_num_threads()}; one prompt at a time, "
                   f"median of {args.repeats}; Tandem: `engine.LLM` defaults (max_num_batched_tokens 2048), "
                   f"prefix caching off; transformers: one forward, last position's logits.\n")  # fmt: skip
        record_run(args.markdown, "bench_prefill.py",
                   run_text("bench_prefill.py", sys.argv[1:], machine_line(f"torch {torch.__version__}"), details, table))  # fmt: skip


if __name__ == "__main__":
    main()
