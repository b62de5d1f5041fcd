"""The engine's greedy tokens against transformers' on one device: tiny models, then the real-size one.

    python -m device_check.launch device_check.engine_parity --device cuda --dtypes float32,bfloat16 \
        --work DIR [--model-dir DIR --model-label TEXT] [--max-new N]

Each model runs in `engine.LLM` (attention backend "triton"; chunked prefill of 16 tokens, so steps
mix decodes with prefill chunks and chunks extend cached ones) and in transformers' generate on the
same device and dtype. float32 must match token for token (tests/engine/test_parity.py's rule); 16-bit
dtypes must agree up to a near tie (tests/engine/greedy_agreement.py, test_parity_bf16.py's rule).
Every model and dtype is checked even after a failure; the exit status is 1 if any failed.
"""

from __future__ import annotations

import argparse
import gc
from pathlib import Path

import torch

from .step_io import figure

MAX_NEW = 24
TINY_ARCHS = ("llama", "qwen3")  # GQA with head_dim 16, and Qwen3's q/k norms with head_dim 32


def check(label: str, model_dir: str, dtype: torch.dtype, device: str, max_new: int = MAX_NEW) -> list[str]:
    """What is wrong with the engine's greedy paths for this model and dtype (nothing: [])."""
    from engine import LLM
    from tests.engine.greedy_agreement import agreement, engine_paths, hf_paths
    from tests.engine.test_parity import PROMPTS

    llm = LLM(model_dir, device=device, dtype=dtype, num_kv_blocks=128, max_num_batched_tokens=16,
              attention_backend="triton")  # fmt: skip
    ours = engine_paths(llm, PROMPTS, max_new)
    free = llm.engine.kv_cache.num_free_blocks == llm.engine.runner.num_blocks
    del llm
    theirs = hf_paths(model_dir, PROMPTS, max_new, dtype, device)
    agreed, problems = agreement(ours, theirs)
    total = max_new * len(PROMPTS)
    name = f"{label}, {str(dtype).removeprefix('torch.')}"
    figure(f"{name}: tokens agreeing with transformers", f"{agreed}/{total}")
    if dtype == torch.float32 and agreed < total:
        problems.append(f"float32 must match token for token: {agreed}/{total}")
    if agreed < total // 2:
        problems.append(f"only {agreed}/{total} tokens agree before the paths part")
    if not free:
        problems.append("KV blocks still held after every request finished")
    _release(device)
    return [f"{name}: {problem}" for problem in problems]


def _release(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def models(work: Path, model_dir: str | None, model_label: str) -> list[tuple[str, str]]:
    from tests.tiny_models import build_tiny_model

    tiny = [(f"tiny {arch}", str(build_tiny_model(work / f"tiny-{arch}", arch))) for arch in TINY_ARCHS]
    return tiny + ([(model_label, model_dir)] if model_dir else [])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--work", required=True)
    parser.add_argument("--model-dir", default=None, help="the real-size model (device_check.real_size_model)")
    parser.add_argument("--model-label", default="real-size model")
    parser.add_argument("--max-new", type=int, default=MAX_NEW, help="greedy tokens per prompt")
    args = parser.parse_args()
    dtypes = [getattr(torch, name) for name in args.dtypes.split(",")]
    problems = [
        problem
        for label, path in models(Path(args.work), args.model_dir, args.model_label)
        for dtype in dtypes
        for problem in check(label, path, dtype, args.device, args.max_new)
    ]
    for problem in problems:
        print(f"FAIL {problem}", flush=True)
    if problems:  # the last line is the reason the summary shows
        print(f"{len(problems)} problem(s); the first: {problems[0]}", flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
