"""The fit recovers the terms that made the steps, and reports how far it is off."""

from __future__ import annotations

import dataclasses
import random

import pytest

from costmodel import StepCost, StepShape
from planner.fit import StepSample, fit_step_cost, sampled_bands

TRUE = StepCost(fixed_s=0.002, weights_s=0.015, per_token_s=0.0005, per_sampled_row_s=0.0002,
                per_decode_context_token_s=1e-6, per_attention_pair_s=3e-7, per_prefill_context_token_s=2e-6,
                per_prefix_attention_pair_s=2e-7, per_small_step_token_s=1e-4)  # fmt: skip


def shapes() -> list[StepShape]:
    out = [StepShape.prefill(n, c) for n in (16, 64, 256, 1024, 2048) for c in (0, 512, 1536)]
    out += [StepShape.decode(rows, ctx) for rows in (1, 4, 16, 64, 128) for ctx in (64, 512, 2048)]
    out += [StepShape.of([(512, 0, True)], [300] * rows) for rows in (4, 32)]
    return out


def test_noiseless_steps_are_fitted_exactly():
    cost, report = fit_step_cost([StepSample(s, TRUE.seconds(s)) for s in shapes()])
    assert report.max_abs_error < 0.01
    assert cost.per_token_s == pytest.approx(TRUE.per_token_s, rel=0.02)
    assert cost.per_prefix_attention_pair_s == pytest.approx(TRUE.per_prefix_attention_pair_s, rel=0.05)
    assert cost.per_small_step_token_s == pytest.approx(TRUE.per_small_step_token_s, rel=0.05)
    assert cost.fixed_s + cost.weights_s == pytest.approx(TRUE.fixed_s + TRUE.weights_s, rel=0.05)


def test_a_few_slowed_steps_do_not_pull_the_fit():
    rng = random.Random(0)
    samples = [StepSample(s, TRUE.seconds(s) * rng.uniform(0.97, 1.03)) for s in shapes() * 3]
    samples += [StepSample(s, TRUE.seconds(s) * 1.6) for s in shapes()[:4]]  # a busy machine's outliers
    cost, report = fit_step_cost(samples)
    assert report.median_abs_error < 0.03
    assert report.worst[0][1] > report.worst[0][2]  # the worst points are the slowed ones, measured above the fit
    big = StepShape.prefill(2048)
    assert cost.seconds(big) == pytest.approx(TRUE.seconds(big), rel=0.05)


def test_each_kernel_band_gets_its_own_term_and_the_cheapest_band_is_zero():
    # Linears on a kernel reading fewer bytes for 1-4 rows, three times the bytes from 5 (the default model's
    # GGUF blocks against oneDNN's bfloat16 GEMM on an AMD EPYC): a smooth line cannot follow the step.
    banded = dataclasses.replace(TRUE, kernel_bands=((1, 0.0), (5, 0.006), (17, 0.004), (257, 0.001)))
    steps = shapes() + [StepShape.decode(rows, ctx) for rows in (2, 5, 8, 17, 32) for ctx in (64, 512)]
    cost, report = fit_step_cost([StepSample(s, banded.seconds(s)) for s in steps], (1, 2, 5, 17, 65, 257))
    assert report.max_abs_error < 0.02
    bands = dict(cost.kernel_bands)
    assert min(bands.values()) == 0.0 and set(bands) == {1, 2, 5, 17, 65, 257}
    assert bands[5] - bands[1] == pytest.approx(0.006, abs=5e-4)
    without, smooth = fit_step_cost([StepSample(s, banded.seconds(s)) for s in steps])
    assert without.kernel_bands == () and smooth.max_abs_error > 0.1


def test_a_band_no_step_fell_in_is_priced_as_the_band_below():
    assert sampled_bands((1, 2, 5, 17), [3, 4, 20]) == (1, 17)  # 5-16 as 2-4's band; 1 as the lowest sampled
    assert sampled_bands((1, 2, 5), [1, 9]) == (1, 5)
    assert sampled_bands((), [1, 9]) == ()


def test_too_few_steps_to_fit_is_an_error():
    with pytest.raises(ValueError, match="at least"):
        fit_step_cost([StepSample(StepShape.decode(1, 1), 0.01)] * 3)
