"""bfloat16 (what dtype "auto" picks on a CPU with native bf16): greedy output close to transformers' own bf16.

Two bf16 implementations round differently (another summation order is another answer), so on tiny
random models, whose top logits are close, greedy paths may part after a while. Parity then means what
vLLM's tests check: the same tokens up to the first difference, and there each side's token among the
other's top alternatives. float32 parity stays token for token (`test_parity.py`).
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine import LLM, SamplingParams
from tests.engine.test_parity import PROMPTS
from tests.tiny_models import ARCHS

MAX_NEW, TOP = 24, 5


def _hf_bf16(model_dir: str) -> list[tuple[list[int], list[set[int]]]]:
    """Per prompt: transformers' bf16 greedy tokens and, per step, its top-TOP token ids."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()  # not the shared fp32 one
    model.generation_config.eos_token_id = None  # generate past EOS, like ignore_eos
    runs = []
    with torch.inference_mode():
        for prompt in PROMPTS:
            out = model.generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW, do_sample=False, pad_token_id=0,
                                 output_scores=True, return_dict_in_generate=True)  # fmt: skip
            tokens = out.sequences[0, len(prompt) :].tolist()
            tops = [set(step[0].float().topk(TOP).indices.tolist()) for step in out.scores]
            runs.append((tokens, tops))
    return runs


def _ours_bf16(model_dir: str) -> list[tuple[list[int], list[set[int]]]]:
    llm = LLM(model_dir, num_kv_blocks=128, dtype="bfloat16")
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=TOP)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    runs = []
    for out in outs:
        completion = out.outputs[0]
        tops = [{completion.token_ids[i], *(t for t, _ in lp.top)} for i, lp in enumerate(completion.logprobs)]
        runs.append((completion.token_ids, tops))
    return runs


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_bf16_greedy_agrees_with_transformers_bf16_up_to_a_near_tie(tiny_model_dirs, arch):
    ours, theirs = _ours_bf16(tiny_model_dirs[arch]), _hf_bf16(tiny_model_dirs[arch])
    agreed = 0
    for (our_tokens, our_tops), (hf_tokens, hf_tops) in zip(ours, theirs):
        assert len(our_tokens) == len(hf_tokens) == MAX_NEW
        step = next((i for i, (a, b) in enumerate(zip(our_tokens, hf_tokens)) if a != b), MAX_NEW)
        agreed += step
        if step < MAX_NEW:  # a near tie: each side's pick is among the other's best
            assert our_tokens[step] in hf_tops[step] and hf_tokens[step] in our_tops[step], (arch, step)
    assert agreed >= MAX_NEW * len(PROMPTS) // 2, f"{arch}: only {agreed} tokens agree before the paths part"
