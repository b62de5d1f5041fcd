"""bench_plan's served steps against the model's price of them, on traces written by hand."""

from __future__ import annotations

import dataclasses
import json

import pytest

from costmodel import StepShape
from scripts import bench_plan_steps
from tests.planner.profiles import hand_profile


def _trace(path, steps):
    """`steps`: (start, seconds, shape, prompt tokens), as `runtime.step_trace` writes them."""
    with open(path, "w") as f:
        for t, s, shape, prompt_tokens in steps:
            f.write(json.dumps({"t": t, "s": s, **dataclasses.asdict(shape), "prompt_tokens": prompt_tokens}) + "\n")


def test_one_workers_steps_in_the_window_against_their_price_with_serving(tmp_path):
    profile = hand_profile()  # 10 ms + 1 ms a token
    serving = dataclasses.replace(profile.serving, step_factor=1.0, prefill_factor=1.0, per_served_row_s=0.002)
    profile = dataclasses.replace(profile, serving=serving)
    decode, prompt = StepShape.decode(4, 100), StepShape.prefill(90)  # priced 14 + 8 ms, 100 + 2 ms
    _trace(tmp_path / "decode-0-1.jsonl", [(0.0, 0.5, prompt, 90),  # before the window
                                          (10.0, 0.033, decode, 0), (11.0, 0.102, prompt, 90), (12.0, 0.022, decode, 0)])
    steps = bench_plan_steps.served_steps(profile, tmp_path, (5.0, 20.0))
    assert steps.steps == 3 and steps.priced_s == pytest.approx(0.022 + 0.102 + 0.022)
    assert (steps.decode_ratio, steps.prompt_ratio) == pytest.approx((0.055 / 0.044, 1.0))
    assert bench_plan_steps.served_steps(profile, tmp_path, (30.0, 40.0)) is None
    table = bench_plan_steps.steps_table([{"layout": "default", "workload": "burst", "served_steps": steps}])
    assert table.splitlines()[-1] == "| default | burst | 3 | 1.08 (0.2 / 0.1 s) | 1.25 | 1.00 |"


def test_a_decode_step_beside_a_prefilling_worker_is_priced_at_the_factor_beside_prefill(tmp_path):
    profile = hand_profile()
    serving = dataclasses.replace(profile.serving, alone_step_factor=1.0, step_factor=1.5, beside_prefill_factor=1.2)
    profile = dataclasses.replace(profile, serving=serving)
    decode = StepShape.decode(2, 50)  # 12 ms profiled
    _trace(tmp_path / "prefill-0-7.jsonl", [(0.0, 1.0, StepShape.prefill(990), 990)])
    _trace(tmp_path / "decode-0-8.jsonl", [(0.5, 0.0144, decode, 0), (2.0, 0.012, decode, 0)])  # beside it, then alone
    steps = bench_plan_steps.served_steps(profile, tmp_path, (0.0, 3.0))
    assert steps.steps == 3 and steps.decode_ratio == pytest.approx(1.0)  # 12 ms x 1.2 beside, x 1.0 alone
    # The prefill step had a decoding neighbour for 1.44% of it: 1,000 ms x (1 + 0.5 x 0.0144)
    assert steps.prompt_ratio == pytest.approx(1.0 / 1.0072)
