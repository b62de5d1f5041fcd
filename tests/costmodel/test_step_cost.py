"""The cost model's arithmetic: shapes of steps, their price term by term, profiles to JSON and back."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from costmodel import ModelDims, Neighbours, Profile, ServingCost, StepCost, StepShape, TransferCost, devices
from costmodel import published_profile
from costmodel.step_cost import SMALL_STEP_TOKENS
from costmodel.step_shape import chunk_attention_pairs
from planner.local_profile import load_samples
from tests.planner.profiles import TINY_DIMS, hand_profile

PROFILES = Path(__file__).resolve().parents[2] / "benchmarks" / "profiles"


def test_a_mixed_step_counts_what_each_term_prices():
    shape = StepShape.of(prefills=[(100, 28, True), (64, 0, False)], decode_contexts=[9, 99])
    assert shape.tokens == 166 and shape.sequences == 4 and shape.sampled_rows == 3
    assert shape.decode_context_tokens == 10 + 100 and shape.longest_decode_context == 100
    assert shape.prefill_attention_pairs == 100 * (28 + 50.5) + 64 * 32.5
    assert shape.prefill_context_tokens == 128 + 64
    assert shape.prefix_attention_pairs == 100 * (28 + 50.5)  # only the chunk after a cached prefix
    assert chunk_attention_pairs(1, 0) == 1  # one query sees itself


def test_a_chunk_after_a_cached_prefix_pays_more_per_pair_and_a_small_step_more_per_token():
    cost = StepCost(per_token_s=0.001, per_small_step_token_s=0.0005, per_attention_pair_s=1e-6,
                    per_prefix_attention_pair_s=5e-7)  # fmt: skip
    whole, after = StepShape.prefill(512), StepShape.prefill(256, 256)
    assert cost.terms(whole)["linear"] == pytest.approx(512 * 0.001 + SMALL_STEP_TOKENS * 0.0005)
    assert cost.terms(StepShape.prefill(64))["linear"] == pytest.approx(64 * 0.0015)
    assert cost.terms(whole)["prefill_attention"] == pytest.approx(whole.prefill_attention_pairs * 1e-6)
    assert cost.terms(after)["prefill_attention"] == pytest.approx(after.prefill_attention_pairs * 1.5e-6)


def test_a_kept_step_gives_its_shape_and_one_kept_before_prefix_pairs_gets_them_from_its_chunks():
    shape = StepShape.of(prefills=[(48, 768, True), (100, 0, True)], decode_contexts=[9])
    line = {"t": 1.0, "s": 0.2, **dataclasses.asdict(shape), "prompt_tokens": 148, "chunks": [[48, 768], [100, 0]]}
    assert StepShape.from_record(line) == shape
    del line["prefix_attention_pairs"]
    assert StepShape.from_record(line) == shape  # from its chunks
    del line["chunks"]
    assert StepShape.from_record(line) == dataclasses.replace(shape, prefix_attention_pairs=0.0)  # nothing to tell


def test_the_linear_layers_cost_whichever_binds():
    cost = StepCost(fixed_s=0.001, weights_s=0.020, per_token_s=0.0005)
    assert cost.seconds(StepShape.decode(1, 10)) == pytest.approx(0.021)  # reading the weights binds
    assert cost.seconds(StepShape.prefill(1000)) == pytest.approx(0.501)  # compute binds
    assert cost.seconds(StepShape.of()) == 0.0


def test_a_step_pays_the_kernel_band_its_token_count_falls_in():
    cost = StepCost(fixed_s=0.005, per_token_s=0.001, kernel_bands=((1, 0.0), (5, 0.004), (17, 0.002)))
    assert [cost.terms(StepShape.decode(rows, 10))["kernel_band"] for rows in (1, 4, 5, 16, 17, 64)] == \
        [0.0, 0.0, 0.004, 0.004, 0.002, 0.002]
    assert cost.seconds(StepShape.decode(5, 10)) == pytest.approx(0.005 + 0.005 + 0.004)
    assert cost.seconds(StepShape.prefill(300)) == pytest.approx(0.005 + 0.3 + 0.002)  # a prompt's tokens too
    assert StepCost.from_dict(cost.to_dict()) == cost  # JSON's lists back to the table
    halved = cost.scaled(lambda term: 0.5 if term == "kernel_bands" else 1.0)
    assert halved.kernel_bands == ((1, 0.0), (5, 0.002), (17, 0.001)) and halved.fixed_s == cost.fixed_s


def test_bad_terms_are_refused_by_name():
    with pytest.raises(ValueError, match="per_token_s"):
        StepCost(per_token_s=-1.0)
    with pytest.raises(ValueError, match="unknown step cost term"):
        StepCost.from_dict({"per_widget_s": 1.0})
    with pytest.raises(ValueError, match="ascending"):
        StepCost(kernel_bands=((5, 0.0), (1, 0.0)))
    with pytest.raises(ValueError, match="kernel band"):
        StepCost(kernel_bands=((1, -0.001),))


def test_a_profile_survives_json(tmp_path):
    profile = hand_profile(transfer=TransferCost(0.003, 2e9))
    profile.save(tmp_path / "p.json")
    assert Profile.load(tmp_path / "p.json") == profile
    assert profile.transfer_seconds(1000) == pytest.approx(0.003 + 32_000 / 2e9)


def test_a_broken_profile_file_says_what_is_wrong(tmp_path):
    (tmp_path / "bad.json").write_text('{"format": 1, "device": "x"}')
    with pytest.raises(ValueError, match="bad.json"):
        Profile.load(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="cannot read profile"):
        Profile.load(tmp_path / "missing.json")


LLAMA_8B = ModelDims("Llama-3.1-8B", num_layers=32, hidden_size=4096, intermediate_size=14336, num_heads=32,
                     num_kv_heads=8, head_dim=128, vocab_size=128256, max_position_embeddings=131072)  # fmt: skip


def test_a_published_decode_step_takes_the_longer_of_the_weights_read_and_the_hosts_launches():
    h100 = published_profile("h100", LLAMA_8B)
    weights_gb = LLAMA_8B.weight_params * 2 / 1e9
    assert 15 < weights_gb < 17  # 8B parameters in bf16
    memory_bound = weights_gb * 1e9 / 3.35e12
    launches = LLAMA_8B.num_layers * devices.HOST_LAUNCHES_PER_LAYER * devices.HOST_PER_LAUNCH_S
    assert memory_bound / 0.75 < launches  # the eager engine's launches bound it, as measured on an H200
    assert h100.step_seconds(StepShape.decode(1, 1000)) == pytest.approx(devices.HOST_STEP_S + launches, rel=0.01)
    # Four fat layers: 34 GB of weights to read, a handful of launches: the memory bound again.
    fat = ModelDims("fat", 4, 16384, 65536, 128, 8, 128, 32000)
    step = published_profile("h200", fat).step_seconds(StepShape.decode(1, 1000))
    bound = fat.weight_params * 2 / 4.8e12
    assert bound < step < bound / 0.75 + 0.002
    tp2 = published_profile("h100", LLAMA_8B, tp_size=2)
    assert tp2.step.weights_s == pytest.approx(h100.step.weights_s) and tp2.step.per_token_comm_s > 0  # launches
    assert tp2.kv_cache_tokens > 2 * h100.kv_cache_tokens  # the second GPU's memory holds no second copy


def test_the_published_h200_profile_predicts_the_steps_measured_on_a_lent_h200():
    # Recorded by scripts/gpu_check.py's profile step (benchmarks/profiles/); the median error it reached then
    # is in costmodel/devices.py's docstring. A change of the published factors shows here.
    measured = Profile.load(PROFILES / "nvidia-h200-smollm2-135m-shape-bf16.json")
    samples = load_samples(PROFILES / "nvidia-h200-smollm2-135m-shape-bf16.samples.json")
    published = published_profile("h200", measured.model)
    errors = sorted(abs(published.step_seconds(s.shape) - s.seconds) / s.seconds for s in samples)
    assert len(errors) > 300 and errors[len(errors) // 2] < 0.15


def test_a_model_that_does_not_fit_is_an_error_not_a_plan():
    huge = ModelDims("huge", 80, 8192, 28672, 64, 8, 128, 128256)  # 70B: 140 GB in bf16
    with pytest.raises(ValueError, match="does not fit on L40S at tp 1"):
        published_profile("l40s", huge)
    assert published_profile("h200", huge, tp_size=2).kv_cache_tokens > 0
    with pytest.raises(ValueError, match="unknown device"):
        published_profile("tpu", TINY_DIMS)


def test_the_served_step_factor_moves_with_the_share_of_busy_neighbours():
    serving = ServingCost(step_factor=1.3, alone_step_factor=1.1)
    assert [serving.factor_at(share) for share in (None, 0.0, 0.5, 1.0)] == pytest.approx([1.1, 1.1, 1.2, 1.3])
    assert ServingCost(step_factor=1.3).factor_at(0.0) == 1.3  # not measured alone: one factor throughout
    assert ServingCost.from_dict(serving.to_dict()) == serving
    assert ServingCost.from_dict(ServingCost().to_dict()).alone_step_factor is None
    older = {k: v for k, v in serving.to_dict().items() if k != "alone_step_factor"}  # a profile cached before it
    assert ServingCost.from_dict(older).alone_step_factor is None
    with pytest.raises(ValueError, match="alone_step_factor must be >= 0"):
        ServingCost(alone_step_factor=-1.0)


def test_prompt_tokens_are_served_at_their_factor_decode_rows_slowed_by_decoding_neighbours():
    serving = ServingCost(step_factor=1.3, alone_step_factor=1.0, prefill_factor=1.1)
    prefilling, decoding = Neighbours(busy=1.0, decoding=0.0), Neighbours(busy=1.0, decoding=1.0)
    assert serving.factor_for(None, 1.0) == pytest.approx(1.1)  # a prompt chunk alone
    assert serving.factor_for(decoding, 1.0) == pytest.approx(1.1)  # contention barely shows on a prompt
    assert serving.factor_for(prefilling, 0.0) == pytest.approx(1.0)  # decode beside a prefill: as alone
    assert serving.factor_for(decoding, 0.0) == pytest.approx(1.3)  # decode beside decode
    assert serving.factor_for(None, 0.5) == pytest.approx(1.05)  # half and half, alone
    assert ServingCost(step_factor=1.3).factor_for(decoding, 1.0) == 1.3  # not measured: one factor for every token
    older = {k: v for k, v in serving.to_dict().items() if k != "prefill_factor"}  # a profile cached before it
    assert ServingCost.from_dict(older).prefill_factor is None
    with pytest.raises(ValueError, match="prefill_factor must be >= 0"):
        ServingCost(prefill_factor=-1.0)


def test_the_time_per_sampled_row_takes_either_sign_and_reads_from_its_earlier_name():
    assert ServingCost(per_served_row_s=-0.001).per_rows(8) == pytest.approx(-0.008)  # the profile priced rows high
    assert ServingCost.from_dict({"per_streamed_token_s": 0.002}).per_served_row_s == 0.002  # kept before the rename
    with pytest.raises(ValueError, match="per_served_row_s must be >= 0"):
        ServingCost(per_served_row_s=float("nan"))
    profile = hand_profile()
    cheap = dataclasses.replace(profile, serving=ServingCost(per_served_row_s=-1.0))
    assert cheap.served_step_seconds(StepShape.decode(4, 100), 0, None) == 0.0  # never below nothing


def test_a_prefill_workers_prompt_steps_pay_for_streaming_their_kv_out():
    profile = dataclasses.replace(hand_profile(), serving=ServingCost(kv_send_s=0.008, kv_send_per_token_s=3e-5))
    prompt, decode = StepShape.prefill(100), StepShape.decode(4, 100)
    sending = profile.served_step_seconds(prompt, 100, None, sends_kv=True)
    assert sending - profile.served_step_seconds(prompt, 100, None) == pytest.approx(0.008 + 100 * 3e-5)
    assert profile.served_step_seconds(decode, 0, None, sends_kv=True) == profile.served_step_seconds(decode, 0, None)
    assert ServingCost.from_dict({"request_s": 0.002}).kv_send(100) == 0.0  # a profile saved before the term


def test_prompt_contention_is_a_line_in_prompt_tokens_at_the_share_of_neighbours_decoding():
    serving = ServingCost(prompt_contention_s=0.02, prompt_contention_per_token_s=0.0001)
    assert serving.prompt_contention(Neighbours(1.0, 1.0), 100) == pytest.approx(0.03)
    assert serving.prompt_contention(Neighbours(1.0, 0.5), 100) == pytest.approx(0.015)
    assert serving.prompt_contention(Neighbours(1.0, 0.0), 100) == 0.0  # a neighbour that only prefills
    assert serving.prompt_contention(None, 100) == 0.0  # alone on its host
    assert serving.prompt_contention(Neighbours(1.0, 1.0), 0) == 0.0  # a decode step: the factors price it
    older = {k: v for k, v in serving.to_dict().items() if not k.startswith("prompt_contention")}
    assert ServingCost.from_dict(older).prompt_contention(Neighbours(1.0, 1.0), 100) == 0.0


def test_a_decode_step_beside_prefilling_neighbours_is_served_at_the_beside_prefill_factor():
    serving = ServingCost(step_factor=1.3, alone_step_factor=1.0, beside_prefill_factor=1.2)
    assert serving.factor_for(Neighbours(1.0, 0.0), 0.0) == pytest.approx(1.2)  # beside a busy prefill worker
    assert serving.factor_for(Neighbours(1.0, 1.0), 0.0) == pytest.approx(1.3)  # beside one that decodes
    assert serving.factor_for(Neighbours(1.0, 0.5), 0.0) == pytest.approx(1.25)  # one of each
    assert serving.factor_for(Neighbours(0.0, 0.0), 0.0) == pytest.approx(1.0)  # neighbours idle
    assert serving.factor_for(None, 0.0) == pytest.approx(1.0)
    unmeasured = ServingCost(step_factor=1.3, alone_step_factor=1.0)
    assert unmeasured.factor_for(Neighbours(1.0, 0.0), 0.0) == pytest.approx(1.0)  # not measured: as alone
    assert ServingCost.from_dict(unmeasured.to_dict()).beside_prefill_factor is None
