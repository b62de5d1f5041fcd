"""Random draws: the distribution, seeded reproducibility across batches, and logit_bias (engine.sampler)."""

import torch

from engine.sampler import Sampler
from tests.engine.test_sampler import VOCAB, probs_logits, random_logits, state


# --- seeded sampling -------------------------------------------------------


def run_steps(steps_logits, make_batch, target_index):
    """Sample several steps; return the tokens of the row at target_index."""
    states = make_batch()
    tokens = []
    for logits in steps_logits:
        out = Sampler()(logits(len(states), target_index), states)
        for s, t in zip(states, out.token_ids):
            s.output_token_ids.append(t)
        tokens.append(out.token_ids[target_index])
    return tokens


def test_seeded_sampling_reproducible_across_batch_compositions():
    target_logits = [random_logits(1, seed=100 + step)[0] for step in range(12)]

    def step_logits(step):
        def build(rows, target):
            logits = random_logits(rows, seed=step)  # other rows get arbitrary logits
            logits[target] = target_logits[step]
            return logits
        return build

    steps = [step_logits(i) for i in range(12)]
    target = dict(seed=1234, temperature=1.3, top_k=20, top_p=0.95, min_p=0.01,
                  frequency_penalty=0.3)
    alone = run_steps(steps, lambda: [state(**target)], 0)
    crowded = run_steps(
        steps,
        lambda: [state(seed=9), state(temperature=0.0), state(**target), state(top_k=2),
                 state(repetition_penalty=1.2, prompt=[1, 2])],
        2,
    )
    reordered = run_steps(steps, lambda: [state(**target), state(seed=5, top_p=0.5)], 0)
    assert alone == crowded == reordered
    # A different seed draws a different sequence (12 draws from a wide distribution).
    other = run_steps(steps, lambda: [state(**{**target, "seed": 4321})], 0)
    assert other != alone


def test_unseeded_rows_use_global_rng():
    logits = torch.zeros(50, VOCAB)
    torch.manual_seed(0)
    first = Sampler()(logits, [state() for _ in range(50)]).token_ids
    torch.manual_seed(0)
    second = Sampler()(logits, [state() for _ in range(50)]).token_ids
    assert first == second
    assert len(set(first)) > 10  # uniform over 32 tokens, not stuck on one


def test_random_draws_follow_the_distribution_and_never_pick_a_zero_probability_token():
    # Four tokens, then four of probability 0.
    logits = torch.cat([probs_logits([0.1, 0.2, 0.3, 0.4], rows=20000), torch.full((20000, 4), float("-inf"))], 1)
    torch.manual_seed(0)
    tokens = torch.tensor(Sampler()(logits, [state() for _ in range(20000)]).token_ids)
    assert tokens.max() <= 3
    frequencies = torch.bincount(tokens, minlength=4).float() / 20000
    torch.testing.assert_close(frequencies, torch.tensor([0.1, 0.2, 0.3, 0.4]), atol=0.015, rtol=0)


def test_logit_bias_is_added_before_sampling_and_ignores_ids_past_the_vocabulary():
    logits = random_logits(3)
    top = logits.argmax(-1).tolist()
    states = [state(temperature=0.0, logit_bias={5: 100.0}),  # forced
              state(temperature=0.0, logit_bias={top[1]: -100.0, VOCAB + 7: 100.0}),  # its best banned
              state(temperature=0.0)]  # fmt: skip
    assert not states[0].is_plain_greedy
    out = Sampler()(logits, states).token_ids
    assert out[0] == 5 and out[1] == logits[1].topk(2).indices[1].item() and out[2] == top[2]
    assert Sampler()(random_logits(4), [state(logit_bias={2: 100.0}, seed=i) for i in range(4)]).token_ids == [2] * 4
