"""What serving a model in quantized blocks costs in accuracy: each `--quantization` against "none".

The default model (SmolLM2-135M-Instruct, Q4_1 linears and a Q8_0 lm_head), or --model, loaded by the engine
(`engine.LLM`) in these ways, each in the dtype auto picks here (or --dtype), after the reference:

  none, float32  every weight widened to float32: the file's values exactly, the reference (the checkpoint
                 the file was quantized from is not at hand: the file's own quantization error is not measured)
  none   every weight widened to the dtype (bfloat16: the file's values rounded to it)
  gguf   the file's blocks, multiplied in the dtype (the file's values, summed in another order)
  auto   the file's blocks, each band of rows by the kernel timed fastest here, integer dot products over
         activations quantized to int8 per block among them (the kernels it chose are printed)
  int8   (a float checkpoint, given by --model, instead of gguf and auto) its linears quantized to Q8_0
         blocks at load, served as auto serves blocks

Measured on each:
  perplexity on a fixed text: the first `--windows` windows of `--window` tokens of Python's own
  documentation topics (`pydoc_data.topics`, the Python running this: fixed per Python version), from
  prompt logprobs; twice, once as prefill computes it (chunks of up to 2,048 rows: the prefill kernels) and
  once a token a step (max_num_batched_tokens 1: the 1-row kernels a decode step of one stream uses)
  greedy agreement with the reference: `--prompts` chat questions, `--tokens` greedy tokens each; how many come
  out identical, and the share of all tokens generated before each first difference.

lm-evaluation-harness's tasks are not run: their datasets come from the Hugging Face hub, not reachable here.

    python scripts/bench_accuracy.py --markdown BENCHMARKS.md
    python scripts/bench_accuracy.py --model FLOAT_CHECKPOINT_DIR --markdown BENCHMARKS.md   # int8
"""

from __future__ import annotations

import argparse
import gc
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from bench_report import add_markdown_option, machine_line, record_run, run_text  # noqa: E402

QUESTIONS = (
    "What is the capital of France?", "Name three primary colors.", "Write a haiku about rain.",
    "Explain what a hash table is in two sentences.", "Give me a recipe for pancakes.",
    "Why is the sky blue?", "List five animals that live in the ocean.", "What does a CPU do?",
    "Write a short poem about autumn leaves.", "How do I reverse a list in Python?",
    "Summarize the plot of Romeo and Juliet.", "What are the benefits of regular exercise?",
    "Translate 'good morning' into Spanish and French.", "What is photosynthesis?",
    "Suggest a name for a pet turtle.", "How many days are there in a leap year, and why?",
)  # fmt: skip


def fixed_text_ids(tokenizer, windows: int, window: int) -> list[list[int]]:
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[name] for name in sorted(topics))
    ids = tokenizer.encode(text)
    if len(ids) < windows * window:
        raise SystemExit(f"the fixed text has {len(ids)} tokens, fewer than {windows} x {window}")
    return [ids[i * window : (i + 1) * window] for i in range(windows)]


def perplexity(llm, windows: list[list[int]]) -> float:
    from engine import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    outs = llm.generate([{"prompt_token_ids": w} for w in windows], params, use_tqdm=False)
    logprobs = [e.logprob for out in outs for e in out.prompt_logprobs if e is not None]
    return math.exp(-sum(logprobs) / len(logprobs))


def greedy(llm, questions: list[list[int]], tokens: int) -> list[list[int]]:
    from engine import SamplingParams

    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": q} for q in questions], params,
                                                         use_tqdm=False)]  # fmt: skip


def chat_ids(tokenizer, question: str) -> list[int]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                        tokenize=True)  # fmt: skip
    return list(ids if isinstance(ids, list) else ids["input_ids"])


def ways(dtype: str, from_gguf: bool) -> list[tuple[str, str]]:
    """(quantization, dtype) pairs: the reference first, then each quantization that means something for the
    model (a GGUF file's: gguf and auto; a float checkpoint's: int8) in `dtype` (auto: resolved)."""
    from engine.config import parse_dtype

    chosen = str(parse_dtype(dtype, "cpu")).removeprefix("torch.")
    modes = [(mode, chosen) for mode in ("none", *(("gguf", "auto") if from_gguf else ("int8",)))]
    return [("none", "float32"), *[way for way in modes if way != ("none", "float32")]]


def measure(mode: str, dtype: str, args, windows, questions) -> dict:
    from engine import LLM

    start = time.perf_counter()
    common = dict(model=args.model, dtype=dtype, quantization=mode, kv_cache_memory=256 * 2**20, max_model_len=4096)
    llm = LLM(**common)
    row = {"mode": mode, "kernels": kernel_summary(llm), "dtype": dtype, "ppl_prefill": perplexity(llm, windows),
           "greedy": greedy(llm, questions, args.tokens)}  # fmt: skip
    del llm
    gc.collect()
    one = LLM(**common, max_num_batched_tokens=1)  # a token a step: the 1-row kernels
    row["ppl_one_row"] = perplexity(one, windows)
    del one
    gc.collect()
    row["seconds"] = time.perf_counter() - start
    return row


def kernel_summary(llm) -> str:
    name = llm.engine.runner.model.ops.name
    return name.split("GGUF blocks by rows: ", 1)[1] if "GGUF blocks by rows: " in name else "widened weights"


def agreement(ours: list[list[int]], reference: list[list[int]]) -> tuple[int, float]:
    """(outputs identical to the reference's, share of the tokens generated before each first difference)."""
    same, before = 0, 0
    for a, b in zip(ours, reference):
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
        same += first == len(a)
        before += first
    return same, before / sum(map(len, reference))


def table(rows: list[dict], questions: int) -> str:
    ref = rows[0]
    lines = ["| quantization | dtype | perplexity, prefill | perplexity, a token a step | greedy outputs identical "
             "to the reference's | tokens before the first difference | kernels of the blocks, by rows |",
             "|---" * 7 + "|"]  # fmt: skip
    for r in rows:
        same, share = agreement(r["greedy"], ref["greedy"])

        def ppl(key: str) -> str:
            return f"{r[key]:.4f}" + ("" if r is ref else f" ({r[key] / ref[key] - 1:+.2%})")

        lines.append(f"| {r['mode']} | {r['dtype']} | {ppl('ppl_prefill')} | {ppl('ppl_one_row')} | "
                     f"{same} / {questions} | {share:.1%} | {r['kernels']} |")  # fmt: skip
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="a GGUF model or a float checkpoint (default: the default model)")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--windows", type=int, default=4, help="windows of the fixed text")
    p.add_argument("--window", type=int, default=512, help="tokens per window")
    p.add_argument("--prompts", type=int, default=len(QUESTIONS), help=f"chat questions (at most {len(QUESTIONS)})")
    p.add_argument("--tokens", type=int, default=64, help="greedy tokens per question")
    add_markdown_option(p)
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    from engine.model_source import resolve_model
    from engine.tokenizer import load_tokenizer

    from engine.gguf_weights import gguf_source

    model_dir = resolve_model(args.model)
    tokenizer = load_tokenizer(str(model_dir))
    windows = fixed_text_ids(tokenizer, args.windows, args.window)
    questions = [chat_ids(tokenizer, q) for q in QUESTIONS[: args.prompts]]
    rows = []
    for mode, dtype in ways(args.dtype, gguf_source(model_dir) is not None):
        rows.append(measure(mode, dtype, args, windows, questions))
        print(f"{mode} {dtype}: perplexity {rows[-1]['ppl_prefill']:.4f} / {rows[-1]['ppl_one_row']:.4f} "
              f"({rows[-1]['seconds']:.0f} s)", flush=True)  # fmt: skip
    text = table(rows, len(questions))
    print(text)
    if args.markdown:
        model = f"`{args.model}`" if args.model else (
            "the default model (SmolLM2-135M-Instruct, its GGUF: Q4_1 linears, Q8_0 lm_head)")
        details = (f"Model: {model}; the reference: quantization none in float32. Fixed text: {args.windows} "
                   f"windows of {args.window} "
                   f"tokens of `pydoc_data.topics` (Python {sys.version.split()[0]}). Greedy: {len(questions)} chat "
                   f"questions, {args.tokens} tokens each (`--ignore-eos`). Perplexities in parentheses: against the "
                   "reference's.")  # fmt: skip
        record_run(args.markdown, "bench_accuracy.py", run_text("bench_accuracy.py", sys.argv[1:], machine_line(),
                                                                details, text))  # fmt: skip


if __name__ == "__main__":
    main()
