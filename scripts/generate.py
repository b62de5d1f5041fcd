"""Generate from a model with the offline engine (the main job until the router lands).

    python scripts/generate.py "What is the capital of France?"
    python scripts/generate.py --model /path/to/hf_dir --max-tokens 64 "Once upon a time"
"""

from __future__ import annotations

import argparse
import sys
import time

from engine import LLM, SamplingParams


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Tandem offline generation")
    p.add_argument("prompts", nargs="+", help="one or more prompts")
    p.add_argument("--model", default=None, help="HF directory, .gguf file or hub id (default: SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", default="auto", help="auto (float32 on CPU), float32, bfloat16, float16")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--max-model-len", type=int, default=None, help="default: the model's own context length")
    p.add_argument("--kv-cache-memory", type=int, default=None, help="KV cache budget in bytes")
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--no-chat", action="store_true", help="send prompts raw, without the chat template")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    try:
        run(args)
    except (ValueError, FileNotFoundError, RuntimeError) as err:
        # A user-facing tool: the message says what is wrong, no traceback.
        sys.exit(f"error: {err}")


def run(args: argparse.Namespace) -> None:
    llm = LLM(
        args.model,
        dtype=args.dtype,
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        kv_cache_memory=args.kv_cache_memory,
        enable_prefix_caching=not args.no_prefix_caching,
    )
    prompts = [_prompt(llm.tokenizer, text, args.no_chat) for text in args.prompts]
    params = SamplingParams(
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed, max_tokens=args.max_tokens
    )
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    for text, out in zip(args.prompts, outputs):
        completion = out.outputs[0]
        print(f"\n>>> {text}\n{completion.text}\n[{len(completion.token_ids)} tokens, {completion.finish_reason}]")
    total = sum(len(o.outputs[0].token_ids) for o in outputs)
    print(f"\n{total} tokens in {elapsed:.2f}s ({total / elapsed:.1f} tok/s)")


def _prompt(tokenizer, text: str, raw: bool):
    if raw or not getattr(tokenizer, "chat_template", None):
        return text
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    return {"prompt": text, "prompt_token_ids": list(ids if isinstance(ids, list) else ids["input_ids"])}


if __name__ == "__main__":
    main()
