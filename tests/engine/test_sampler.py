import math

import pytest
import torch

from engine.sampler import (
    Sampler,
    SamplerOutput,
    SamplingState,
    TokenLogprobs,
    apply_min_tokens,
    apply_penalties,
)
from engine.sampling_params import SamplingParams

VOCAB = 32


def state(prompt=(), output=(), eos=(), **kwargs) -> SamplingState:
    return SamplingState.create(SamplingParams(**kwargs), list(prompt), list(output), eos)


def random_logits(rows: int, vocab: int = VOCAB, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, vocab, generator=g) * 3  # [rows, vocab]


def probs_logits(probs: list[float], rows: int) -> torch.Tensor:
    return torch.tensor(probs).log().expand(rows, -1).clone()  # [rows, len(probs)]


# --- SamplingState -----------------------------------------------------------


def test_create_seeds_generator_only_when_seed_given():
    assert state().generator is None
    seeded = state(seed=3)
    assert isinstance(seeded.generator, torch.Generator)
    assert seeded.generator.initial_seed() == 3


def test_state_shares_output_list():
    out: list[int] = []
    s = SamplingState.create(SamplingParams(min_tokens=1), [1], out, (0,))
    assert s.min_tokens_active
    out.append(5)
    assert not s.min_tokens_active


# --- greedy ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_greedy_equals_argmax(dtype):
    logits = random_logits(8).to(dtype)
    logits[3, 5] = logits[3, 9] = logits[3].max() + 1  # tie: lowest index wins
    out = Sampler()(logits, [state(temperature=0.0) for _ in range(8)])
    assert isinstance(out, SamplerOutput)
    assert out.token_ids == logits.argmax(-1).tolist()
    assert out.token_ids[3] == 5
    assert out.logprobs == [None] * 8


def test_all_greedy_batch_takes_fast_path(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("slow path used for an all-greedy batch")

    monkeypatch.setattr(Sampler, "_sample_processed", boom)
    logits = random_logits(4)
    states = [state(temperature=0.0), state(temperature=0.0, logprobs=2),
              state(temperature=0.0, min_tokens=1, output=[1]),  # min_tokens already met
              state(temperature=0.0, seed=1)]
    assert Sampler()(logits, states).token_ids == logits.argmax(-1).tolist()


def test_penalised_greedy_leaves_fast_path(monkeypatch):
    calls = []
    original = Sampler._sample_processed

    def spy(self, logits, states):
        calls.append(len(states))
        return original(self, logits, states)

    monkeypatch.setattr(Sampler, "_sample_processed", spy)
    Sampler()(random_logits(2), [state(temperature=0.0), state(temperature=0.0, min_tokens=1, eos=(0,))])
    Sampler()(random_logits(2), [state(temperature=0.0), state(temperature=0.0, repetition_penalty=1.5)])
    assert calls == [2, 2]


def test_greedy_rows_in_mixed_batch_equal_argmax():
    logits = random_logits(6)
    states = [state(temperature=0.0 if i % 2 == 0 else 1.0, seed=i) for i in range(6)]
    out = Sampler()(logits, states)
    expected = logits.argmax(-1).tolist()
    assert [out.token_ids[i] for i in (0, 2, 4)] == [expected[i] for i in (0, 2, 4)]


def test_logits_are_not_modified():
    logits = random_logits(3)
    before = logits.clone()
    states = [state(repetition_penalty=2.0, prompt=[1, 2], output=[3], temperature=0.7,
                    top_k=3, top_p=0.5, min_p=0.1, frequency_penalty=1.0, seed=0),
              state(temperature=0.0, min_tokens=2, eos=(4,)),
              state(presence_penalty=1.0, output=[0])]
    Sampler()(logits, states)
    assert torch.equal(logits, before)


def test_shape_mismatch_and_empty_batch():
    with pytest.raises(ValueError, match="num_seqs"):
        Sampler()(random_logits(2), [state()])
    with pytest.raises(ValueError):
        Sampler()(torch.zeros(VOCAB), [state()])
    out = Sampler()(torch.zeros(0, VOCAB), [])
    assert out.token_ids == [] and out.logprobs == []


# --- filters ---------------------------------------------------------------


def test_top_k_one_equals_greedy():
    logits = random_logits(64, seed=3)
    out = Sampler()(logits, [state(top_k=1, temperature=2.0, seed=i) for i in range(64)])
    assert out.token_ids == logits.argmax(-1).tolist()


def test_tiny_top_p_equals_greedy():
    logits = random_logits(64, seed=4)
    out = Sampler()(logits, [state(top_p=1e-6, temperature=1.5, seed=i) for i in range(64)])
    assert out.token_ids == logits.argmax(-1).tolist()


def sample_set(logits, **kwargs) -> set[int]:
    torch.manual_seed(0)
    return set(Sampler()(logits, [state(**kwargs) for _ in range(logits.shape[0])]).token_ids)


def test_top_k_restricts_to_k_most_likely():
    logits = torch.arange(VOCAB, dtype=torch.float32).flip(0).expand(400, -1) * 0.1
    assert sample_set(logits, top_k=3) == {0, 1, 2}
    assert len(sample_set(logits, top_k=-1)) > 3


def test_top_p_keeps_smallest_nucleus():
    logits = probs_logits([0.5, 0.3, 0.15, 0.05], rows=400)
    assert sample_set(logits, top_p=0.45) == {0}
    assert sample_set(logits, top_p=0.79) == {0, 1}
    assert sample_set(logits, top_p=0.81) == {0, 1, 2}
    assert sample_set(logits, top_p=1.0) == {0, 1, 2, 3}


def test_min_p_filters_relative_to_top_probability():
    logits = probs_logits([0.5, 0.3, 0.15, 0.05], rows=400)
    assert sample_set(logits, min_p=0.25) == {0, 1, 2}  # threshold 0.125
    assert sample_set(logits, min_p=0.5) == {0, 1}  # threshold 0.25
    assert sample_set(logits, min_p=1.0) == {0}
    assert sample_set(logits, min_p=0.0) == {0, 1, 2, 3}


def test_filters_compose():
    logits = probs_logits([0.4, 0.3, 0.2, 0.1], rows=400)
    assert sample_set(logits, top_k=3, top_p=0.95) == {0, 1, 2}
    # top_k keeps 3, renormalised [0.44, 0.33, 0.22]; top_p 0.7 keeps {0, 1}.
    assert sample_set(logits, top_k=3, top_p=0.7) == {0, 1}


@pytest.mark.parametrize("temperature", [0.25, 1.0, 4.0])
def test_temperature_scales_distribution(temperature):
    rows = 4000
    logits = torch.tensor([[1.0, 0.0]]).expand(rows, -1)
    torch.manual_seed(1)
    tokens = Sampler()(logits, [state(temperature=temperature) for _ in range(rows)]).token_ids
    frequency = tokens.count(0) / rows
    expected = 1.0 / (1.0 + math.exp(-1.0 / temperature))
    # Standard error is at most 0.008; 0.03 is ~4 sigma.
    assert abs(frequency - expected) < 0.03


def test_random_rows_sample_proportionally():
    rows = 4000
    logits = probs_logits([0.6, 0.3, 0.1], rows)
    torch.manual_seed(2)
    tokens = Sampler()(logits, [state() for _ in range(rows)]).token_ids
    for token, p in enumerate([0.6, 0.3, 0.1]):
        assert abs(tokens.count(token) / rows - p) < 0.03


# --- penalties -------------------------------------------------------------


def test_repetition_penalty_matches_reference():
    logits = torch.tensor([[2.0, -1.0, 0.5, -3.0, 1.0, 0.0]])
    x = logits.clone()
    apply_penalties(x, [state(prompt=[0, 1], output=[1, 2, 2], repetition_penalty=2.0)])
    # Seen tokens 0, 1, 2: positives divided, negatives multiplied; others untouched.
    expected = torch.tensor([[1.0, -2.0, 0.25, -3.0, 1.0, 0.0]])
    assert torch.equal(x, expected)


def test_presence_and_frequency_penalties_match_reference():
    logits = torch.tensor([[2.0, -1.0, 0.5, -3.0, 1.0, 0.0]])
    x = logits.clone()
    apply_penalties(x, [state(prompt=[4, 5], output=[1, 2, 2, 2],
                              presence_penalty=0.5, frequency_penalty=0.25)])
    # Only output tokens count: token 1 once, token 2 three times; prompt is ignored.
    expected = torch.tensor([[2.0, -1.0 - 0.5 - 0.25, 0.5 - 0.5 - 0.75, -3.0, 1.0, 0.0]])
    assert torch.allclose(x, expected, atol=0, rtol=1e-6)


def test_penalties_combined_and_per_row():
    logits = torch.tensor([[1.0, 2.0, -1.0, 0.0], [1.0, 2.0, -1.0, 0.0], [1.0, 2.0, -1.0, 0.0]])
    x = logits.clone()
    apply_penalties(x, [
        state(prompt=[0], output=[1, 1], repetition_penalty=1.25, presence_penalty=-0.5,
              frequency_penalty=1.0),
        state(prompt=[0], output=[1, 1]),  # no penalties: row untouched
        state(prompt=[2], output=[7, 99], repetition_penalty=4.0),  # out-of-vocab ids ignored
    ])
    expected = torch.tensor([
        [1.0 / 1.25, 2.0 / 1.25 + 0.5 - 2.0, -1.0, 0.0],
        [1.0, 2.0, -1.0, 0.0],
        [1.0, 2.0, -4.0, 0.0],
    ])
    assert torch.allclose(x, expected, atol=0, rtol=1e-6)


def test_penalty_changes_greedy_choice():
    logits = torch.tensor([[3.0, 2.0, 0.0]])
    plain = Sampler()(logits, [state(temperature=0.0, output=[0])])
    penalised = Sampler()(logits, [state(temperature=0.0, output=[0], repetition_penalty=2.0)])
    assert plain.token_ids == [0] and penalised.token_ids == [1]


# --- min_tokens ------------------------------------------------------------


def test_min_tokens_masks_eos_and_stop_token_ids():
    x = torch.zeros(2, 6)
    apply_min_tokens(x, [state(min_tokens=2, output=[1], eos=(5,), stop_token_ids=[3, 40]),
                         state(min_tokens=1, output=[1], eos=(5,))])
    assert x[0].tolist() == [0, 0, 0, -math.inf, 0, -math.inf]
    assert x[1].tolist() == [0.0] * 6  # min_tokens reached


def test_min_tokens_blocks_eos_until_reached():
    logits = torch.tensor([[0.0, 1.0, 9.0]])  # EOS (2) is the argmax
    out: list[int] = []
    s = SamplingState.create(SamplingParams(temperature=0.0, min_tokens=2), [0], out, (2,))
    assert Sampler()(logits, [s]).token_ids == [1]
    out.append(1)
    assert Sampler()(logits, [s]).token_ids == [1]
    out.append(1)
    assert Sampler()(logits, [s]).token_ids == [2]


def test_min_tokens_blocks_eos_when_sampling():
    logits = torch.tensor([[0.0, 0.0, 5.0]]).expand(300, -1)
    torch.manual_seed(0)
    states = [state(min_tokens=1, eos=(2,)) for _ in range(300)]
    assert 2 not in Sampler()(logits, states).token_ids


# --- logprobs --------------------------------------------------------------


def test_logprobs_from_raw_logits_with_rank_and_top():
    logits = random_logits(3, seed=7)
    states = [state(temperature=0.0, logprobs=3),
              state(temperature=0.7, repetition_penalty=3.0, output=[0, 1, 2], logprobs=0, seed=1),
              state(temperature=0.0)]
    out = Sampler()(logits, states)
    raw = torch.log_softmax(logits, dim=-1)
    for row in (0, 1):
        lp = out.logprobs[row]
        assert isinstance(lp, TokenLogprobs)
        token = out.token_ids[row]
        assert lp.token_id == token
        assert lp.logprob == pytest.approx(raw[row, token].item(), abs=1e-6)
        assert lp.rank == int((raw[row] > raw[row, token]).sum()) + 1
    assert out.logprobs[0].rank == 1
    top_ids = raw[0].argsort(descending=True)[:3].tolist()
    assert [t for t, _ in out.logprobs[0].top] == top_ids
    assert [v for _, v in out.logprobs[0].top] == pytest.approx(raw[0, top_ids].tolist(), abs=1e-6)
    assert out.logprobs[1].top == ()
    assert out.logprobs[2] is None


def test_logprob_rank_of_non_top_token():
    logits = torch.tensor([[5.0, 4.0, 3.0, -1.0]])
    out = Sampler()(logits, [state(temperature=0.0, logprobs=2, output=[0, 1],
                                   presence_penalty=2.0, frequency_penalty=2.0)])
    # Penalties push tokens 0 and 1 below token 2, which is rank 3 under the raw logits.
    assert out.token_ids == [2]
    lp = out.logprobs[0]
    assert lp.rank == 3
    assert lp.logprob == pytest.approx(torch.log_softmax(logits[0], -1)[2].item(), abs=1e-6)
    assert [t for t, _ in lp.top] == [0, 1]


def test_logprobs_bfloat16_computed_in_float32():
    logits = random_logits(2, seed=8).to(torch.bfloat16)
    out = Sampler()(logits, [state(temperature=0.0, logprobs=1)] * 2)
    raw = torch.log_softmax(logits.float(), dim=-1)
    for row in range(2):
        token = out.token_ids[row]
        assert out.logprobs[row].logprob == pytest.approx(raw[row, token].item(), abs=1e-6)


def test_row_argmax_matches_argmax_and_takes_first_of_ties():
    from engine.sampler import row_argmax

    x = torch.randn(5, 300)
    x[1, [7, 200]] = 50.0  # a tie: the first index wins, as with argmax
    x[3] = 0.0  # all equal
    assert torch.equal(row_argmax(x), x.argmax(dim=-1))
    assert row_argmax(x)[1] == 7 and row_argmax(x)[3] == 0

