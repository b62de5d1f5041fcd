"""Greedy output of engine.LLM equals transformers' greedy generate, token for token."""

from __future__ import annotations

import functools

import pytest
import torch

from engine import LLM, SamplingParams
from tests.conftest import hf_greedy, hf_model
from tests.tiny_models import ARCHS

MAX_NEW = 24
# Lengths that are not multiples of the block size; the last two share a 40-token prefix.
_BASE = [(7 * i + 3) % 380 + 3 for i in range(64)]
PROMPTS = [_BASE[:5], _BASE[10:27], list(reversed(_BASE[:33])), _BASE[:40] + [5, 6, 7], _BASE[:40] + [9, 9]]

SCENARIOS = {
    # name: engine kwargs
    "default": dict(num_kv_blocks=128),
    "chunked_prefill": dict(num_kv_blocks=128, max_num_batched_tokens=8),
    "no_prefix_cache": dict(num_kv_blocks=128, enable_prefix_caching=False, max_num_batched_tokens=16),
    "preemption": dict(num_kv_blocks=10, max_num_batched_tokens=32),
    "block_size_8": dict(num_kv_blocks=256, block_size=8, max_num_batched_tokens=12),
}


@functools.cache
def _reference(model_dir: str) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(hf_greedy(model_dir, p, MAX_NEW)) for p in PROMPTS)


def _generate(llm: LLM) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_greedy_matches_transformers(tiny_model_dirs, arch, scenario):
    model_dir = tiny_model_dirs[arch]
    llm = LLM(model_dir, **SCENARIOS[scenario], dtype="float32")
    expected = [list(r) for r in _reference(model_dir)]
    assert _generate(llm) == expected
    engine = llm.engine
    if scenario == "preemption":
        assert engine.scheduler.num_preemptions > 0, "the tiny pool should have forced preemption"
    # Second pass: with prefix caching the prompts now hit the cache, and the answer is the same.
    second = llm.generate(
        [{"prompt_token_ids": p} for p in PROMPTS],
        SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True),
        use_tqdm=False,
    )
    assert [o.outputs[0].token_ids for o in second] == expected
    hits = [o.num_cached_tokens for o in second]
    if engine.kv_cache.enable_prefix_caching and scenario != "preemption":
        assert all(h > 0 for h in hits[1:]), hits
    if not engine.kv_cache.enable_prefix_caching:
        assert hits == [0] * len(PROMPTS)
    assert engine.kv_cache.num_free_blocks == engine.runner.num_blocks


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_prefill_logits_match_transformers(tiny_model_dirs, arch):
    """Logits at every prompt position agree with transformers within float tolerance."""
    from engine.model_input import build_model_input
    from engine.scheduler import ScheduledRequest

    model_dir = tiny_model_dirs[arch]
    llm = LLM(model_dir, num_kv_blocks=16, dtype="float32")
    engine = llm.engine
    prompt = PROMPTS[3]
    engine.add_request("r", {"prompt_token_ids": prompt}, SamplingParams(max_tokens=1))
    req = engine.requests["r"]
    assert engine.kv_cache.allocate_slots(req, len(prompt))
    batch = build_model_input([ScheduledRequest.of(req, len(prompt))], engine.config.cache.block_size, "cpu")
    runner = engine.runner
    with torch.inference_mode():
        hidden = runner.model(batch.input_ids, batch.positions, runner.kv_caches, batch.meta, runner.attn_fn)
        ours = runner.model.compute_logits(hidden)  # [num_tokens, vocab]
        ref = hf_model(model_dir)(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)
    engine.abort_request("r")
    assert engine.kv_cache.num_free_blocks == runner.num_blocks
