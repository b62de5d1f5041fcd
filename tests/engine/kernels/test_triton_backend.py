"""The Triton backend end to end: mixed batches, the whole engine's greedy tokens, refused configs."""

import dataclasses

import pytest
import torch

from engine import LLM, SamplingParams
from engine.attention import AttentionMetadata, select_backend
from engine.config import EngineConfig, ModelConfig
from tests.engine.kernels.paged_inputs import paged_batch


def test_mixed_batch_matches_torch_backend():
    """Two decodes then two prefill chunks (one extending a cached prefix) in one step, with -1 slots."""
    block_size, num_kv_heads, group, head_dim = 16, 2, 4, 64
    seq_lens, query_lens = [23, 40, 30, 19], [1, 1, 12, 19]
    batch = paged_batch(seq_lens, query_lens, block_size, num_kv_heads, group, head_dim)
    new_kv = torch.randn(2, sum(query_lens), num_kv_heads, head_dim)
    slots = []
    for table, ctx, new in zip(batch.block_tables, seq_lens, query_lens):
        slots += [int(table[p // block_size]) * block_size + p % block_size for p in range(ctx - new, ctx)]
    slots = torch.tensor(slots)
    slots[-3:] = -1  # the chunk's last tokens were already cached: not rewritten
    meta = AttentionMetadata(
        slot_mapping=slots,
        query_start_loc=batch.query_start_loc,
        seq_lens=batch.seq_lens,
        block_tables=batch.block_tables,
        num_decodes=2,
        query_start_loc_host=tuple(batch.query_start_loc.tolist()),
        seq_lens_host=tuple(seq_lens),
        block_size=block_size,
        all_slots_valid=False,
    )
    results = []
    for name in ("triton", "torch"):
        caches = batch.key_cache.clone(), batch.value_cache.clone()
        out = select_backend(name, "cpu")(batch.query, new_kv[0], new_kv[1], *caches, meta, head_dim**-0.5)
        results.append((out, caches))
    (out, caches), (ref_out, ref_caches) = results
    assert torch.equal(caches[0], ref_caches[0]) and torch.equal(caches[1], ref_caches[1])
    torch.testing.assert_close(out, ref_out, atol=2e-5, rtol=1e-4)


def _greedy(model_dir: str, backend: str) -> list[list[int]]:
    # 8 tokens a step: the short prompt decodes while the long one is prefilled
    # in chunks (mixed steps, extends over cached chunks); on the second pass the
    # long prompt hits its first 16 tokens in the prefix cache.
    llm = LLM(model_dir, num_kv_blocks=32, max_num_batched_tokens=8, attention_backend=backend, dtype="float32")
    prompts = [[3, 14, 15, 92, 65, 2], [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43, 38, 32, 79, 50, 28]]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    requests = [{"prompt_token_ids": p} for p in prompts]
    outs = []
    for _ in range(2):
        outs += [o.outputs[0].token_ids for o in llm.generate(requests, params, use_tqdm=False)]
    return outs


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_engine_greedy_tokens_match_torch_backend(tiny_model_dirs, arch):
    assert _greedy(tiny_model_dirs[arch], "triton") == _greedy(tiny_model_dirs[arch], "torch")


def _config(tiny_model_dirs, **changes) -> dict:
    model = ModelConfig.from_pretrained(tiny_model_dirs["llama"])
    fields = dict(model_dir=tiny_model_dirs["llama"], model=model, attention_backend="triton")
    for name, value in changes.items():
        if name == "head_dim":
            fields["model"] = dataclasses.replace(model, head_dim=value)
        else:
            fields[name] = value
    return fields


def test_unsupported_head_dim_is_refused_at_config(tiny_model_dirs):
    with pytest.raises(ValueError, match="head_dim"):
        EngineConfig(**_config(tiny_model_dirs, head_dim=80))


def test_unsupported_block_size_is_refused_at_config(tiny_model_dirs):
    from engine.config import CacheConfig

    with pytest.raises(ValueError, match="block_size"):
        EngineConfig(**_config(tiny_model_dirs, cache=CacheConfig(block_size=8)))
    with pytest.raises(ValueError, match="block_size"):
        LLM(tiny_model_dirs["llama"], block_size=8, attention_backend="triton", dtype="float32")


def test_cpu_without_interpreter_or_in_bfloat16_is_refused(tiny_model_dirs, monkeypatch):
    with pytest.raises(ValueError, match="float32"):
        EngineConfig(**_config(tiny_model_dirs, dtype=torch.bfloat16))
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        EngineConfig(**_config(tiny_model_dirs))
