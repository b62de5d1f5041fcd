"""Greedy paths of the engine and of transformers, and how far two that round differently agree.

Two bf16 implementations round differently (another summation order is another answer), so greedy
paths may part at a near tie. Agreement then means what vLLM's tests check: the same tokens up to
the first difference, and there each side's token among the other's top alternatives. Used by
tests/engine/test_parity_bf16.py on CPU and by the GPU check (scripts/device_check/engine_parity.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

TOP = 5


@dataclass(frozen=True)
class GreedyPath:
    tokens: list[int]
    tops: list[set[int]]  # per step, the TOP best token ids (the chosen one included)


def hf_paths(model_dir: str, prompts: list[list[int]], max_new: int, dtype: torch.dtype, device: str = "cpu"):
    """transformers' greedy generate, one prompt at a time (no padding), EOS ignored."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval().to(device)
    model.generation_config.eos_token_id = None  # generate past EOS, like ignore_eos
    paths = []
    with torch.inference_mode():
        for prompt in prompts:
            out = model.generate(torch.tensor([prompt], device=device), max_new_tokens=max_new, do_sample=False,
                                 pad_token_id=0, output_scores=True, return_dict_in_generate=True)  # fmt: skip
            tokens = out.sequences[0, len(prompt) :].tolist()
            paths.append(GreedyPath(tokens, [set(step[0].float().topk(TOP).indices.tolist()) for step in out.scores]))
    return paths


def engine_paths(llm, prompts: list[list[int]], max_new: int) -> list[GreedyPath]:
    """engine.LLM's greedy paths for the prompts, all in one batch, EOS ignored."""
    from engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_new, ignore_eos=True, logprobs=TOP)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    paths = []
    for out in outs:
        completion = out.outputs[0]
        tops = [{completion.token_ids[i], *(t for t, _ in lp.top)} for i, lp in enumerate(completion.logprobs)]
        paths.append(GreedyPath(list(completion.token_ids), tops))
    return paths


def agreement(ours: list[GreedyPath], theirs: list[GreedyPath]) -> tuple[int, list[str]]:
    """Tokens agreed before the paths part (summed over prompts), and every parting that is no near tie."""
    agreed, problems = 0, []
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        if len(a.tokens) != len(b.tokens):
            problems.append(f"prompt {i}: {len(a.tokens)} tokens against {len(b.tokens)}")
            continue
        step = next((j for j, (x, y) in enumerate(zip(a.tokens, b.tokens)) if x != y), len(a.tokens))
        agreed += step
        if step < len(a.tokens) and not (a.tokens[step] in b.tops[step] and b.tokens[step] in a.tops[step]):
            problems.append(f"prompt {i}: token {step} is {a.tokens[step]} against {b.tokens[step]}, not a near tie")
    return agreed, problems
