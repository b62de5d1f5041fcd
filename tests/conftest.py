"""Shared fixtures: tiny real models on disk and transformers references."""

from __future__ import annotations

import functools
import os

import pytest
import torch

from tests.tiny_models import ARCHS, build_tiny_model

# Two cores: let torch use both, but keep thread pools from oversubscribing.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory) -> dict[str, str]:
    """arch -> directory of a tiny random model; llama is saved sharded with an index."""
    root = tmp_path_factory.mktemp("tiny_models")
    return {
        arch: str(build_tiny_model(root / arch, arch, max_shard_size="100KB" if arch == "llama" else None))
        for arch in ARCHS
    }


@functools.cache
def hf_model(model_dir: str):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    # Generate past EOS like the engine's ignore_eos (min_new_tokens would mask EOS instead).
    model.generation_config.eos_token_id = None
    return model


def hf_greedy(model_dir: str, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy generate, one prompt at a time (no padding), EOS ignored."""
    model = hf_model(model_dir)
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt_ids]),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(prompt_ids) :].tolist()
