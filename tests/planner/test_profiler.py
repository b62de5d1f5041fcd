"""`tandem profile`'s machinery on a tiny real model: the grid's steps, the fit, the KV probe, the cache."""

from __future__ import annotations

import pytest

from costmodel import StepShape
from engine import EngineArgs, LLMEngine
from planner.fit import fit_step_cost
from planner.layout import EngineLimits
from planner.local_profile import LocalWorker, load_samples, local_profile
from planner.profiler import KERNEL_BAND_FIRSTS, ProfileGrid, profile_steps


def test_the_grid_times_each_kind_of_step(tiny_model_dirs):
    engine = LLMEngine.from_args(EngineArgs(model=tiny_model_dirs["llama"], dtype="float32", max_model_len=256,
                                            max_num_batched_tokens=64), show_progress=False)  # fmt: skip
    samples = profile_steps(engine, ProfileGrid.tiny())
    shapes = [s.shape for s in samples]
    assert any(s.sequences == 8 and s.tokens == 8 and s.longest_decode_context > 48 for s in shapes)  # 8 rows, ctx 48
    assert any(s.tokens == 64 and s.sequences == 1 for s in shapes)  # a 96-token prompt, chunked by the budget
    assert any(s.prefill_context_tokens >= 32 + 16 and s.tokens == 16 for s in shapes)  # after a cached prefix
    assert any(s.decode_context_tokens and s.prefill_attention_pairs for s in shapes)  # mixed
    assert all(s.seconds > 0 for s in samples)
    for sample in samples:  # the prefill chunks kept beside each shape give its prefill counts
        chunks = StepShape.of(prefills=[(new, context, False) for new, context in sample.chunks])
        assert chunks.prefill_attention_pairs == sample.shape.prefill_attention_pairs
        assert chunks.prefill_context_tokens == sample.shape.prefill_context_tokens
    assert not engine.has_unfinished_requests() and engine.kv_cache.num_free_blocks == engine.kv_cache.pool.num_blocks
    cost, report = fit_step_cost(samples)
    assert report.points == len(samples) and cost.seconds(shapes[0]) > 0


def test_the_default_grid_steps_both_sides_of_each_kernel_band_edge_it_reaches():
    rows = set(ProfileGrid().decode_rows)
    for first in KERNEL_BAND_FIRSTS[1:]:
        if first <= max(rows):
            assert {first - 1, first} <= rows, first


def test_a_profile_is_measured_once_and_then_read_from_the_cache(tiny_model_dirs, tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path))
    worker = LocalWorker(tiny_model_dirs["llama"], "float32", 1, EngineLimits(max_model_len=256,
                                                                             max_num_batched_tokens=64))  # fmt: skip
    first = local_profile(worker, grid=ProfileGrid.tiny())
    assert first.source == "measured" and first.torch_threads == 1 and first.fit.points > 20
    assert first.transfer.bytes_per_s > 1e6 and first.kv_cache_tokens > 0
    assert first.model.num_layers == 2 and first.dtype == "float32" and first.dtype_bytes == 4
    (samples_file,) = (tmp_path / "profiles").glob("*.samples.json")
    kept = load_samples(samples_file)
    assert len(kept) == first.fit.points and any(s.chunks for s in kept)
    assert [first for first, _ in first.step.kernel_bands][:3] == [1, 2, 5]  # the tiny grid's 1, 4 and 8 rows

    import planner.local_profile

    monkeypatch.setattr(planner.local_profile, "measure_profile", lambda *a, **k: pytest.fail("measured again"))
    assert local_profile(worker, grid=ProfileGrid.tiny()) == first
    other = LocalWorker(tiny_model_dirs["llama"], "float32", 2, worker.limits)  # another thread count: another key
    with pytest.raises(pytest.fail.Exception):
        local_profile(other, grid=ProfileGrid.tiny())
