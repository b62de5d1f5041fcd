"""bfloat16 (what dtype "auto" picks on a CPU with native bf16): greedy output close to transformers' own bf16.

On tiny random models, whose top logits are close, greedy paths may part after a while: parity then
means agreement up to a near tie (`tests/engine/greedy_agreement.py`). float32 parity stays token for
token (`test_parity.py`).
"""

from __future__ import annotations

import pytest
import torch

from engine import LLM
from tests.engine.greedy_agreement import agreement, engine_paths, hf_paths
from tests.engine.test_parity import PROMPTS
from tests.tiny_models import ARCHS

MAX_NEW = 24


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_bf16_greedy_agrees_with_transformers_bf16_up_to_a_near_tie(tiny_model_dirs, arch):
    model_dir = tiny_model_dirs[arch]
    ours = engine_paths(LLM(model_dir, num_kv_blocks=128, dtype="bfloat16"), PROMPTS, MAX_NEW)
    theirs = hf_paths(model_dir, PROMPTS, MAX_NEW, torch.bfloat16)  # not the shared fp32 model
    assert all(len(p.tokens) == MAX_NEW for p in ours + theirs)
    agreed, problems = agreement(ours, theirs)
    assert not problems, (arch, problems)
    assert agreed >= MAX_NEW * len(PROMPTS) // 2, f"{arch}: only {agreed} tokens agree before the paths part"
