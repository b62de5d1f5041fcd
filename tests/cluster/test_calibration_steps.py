"""The serving calibration's fit from served steps (`runtime.step_trace` lines), on steps made by hand: the step
factors and the loop's time between steps come out as they were put in."""

from __future__ import annotations

import dataclasses

import pytest

from cluster import calibration_steps as steps
from cluster import serving_calibration as calibration
from cluster.calibration_record import CalibrationRecord
from costmodel import StepShape
from tests.cluster.test_serving_calibration import _outcomes, _profile


def _line(t: float, seconds: float, shape: StepShape, prompt_tokens: int = 0) -> dict:
    return {"t": t, "s": seconds, **dataclasses.asdict(shape), "prompt_tokens": prompt_tokens}


def _worker(profile, shapes, factor_of, start=0.0, gap=0.001, pause_every=0, pause_s=1.0):
    """Steps one after another, each `gap` after the last (a pause of `pause_s` every `pause_every` steps)."""
    lines, t = [], start
    for i, (shape, prompt_tokens) in enumerate(shapes):
        seconds = profile.step_seconds(shape) * factor_of(t, shape, prompt_tokens)
        lines.append(_line(t, seconds, shape, prompt_tokens))
        t += seconds + gap + (pause_s if pause_every and (i + 1) % pause_every == 0 else 0.0)
    return lines


def test_one_worker_gets_a_factor_for_decode_rows_one_for_prompt_tokens_a_time_per_token_and_its_round_gap():
    profile = _profile()
    decodes = [(StepShape.decode(rows, 300), 0) for rows in (1, 2, 4, 8, 16)]
    mixed = StepShape.of([(256, 0, True)], [300] * 4)  # 256 of 260 tokens prompt, 5 sampled
    shapes = decodes * 12 + [(mixed, 256)] * 10
    share = 256 / 260

    def factor(t, shape, prompt_tokens):
        served = profile.step_seconds(shape) * (1.5 * share + 1.2 * (1 - share) if prompt_tokens else 1.2)
        return (served + 0.002 * shape.sampled_rows) / profile.step_seconds(shape)  # 2 ms a streamed token

    lines = {"decode-0-1": _worker(profile, shapes, factor)}
    assert steps.step_factors(profile, lines) == {"step_factor": pytest.approx(1.2), "prefill_factor": pytest.approx(1.5),
                                                  "per_served_row_s": pytest.approx(0.002)}  # fmt: skip
    assert steps.round_gap(lines) == pytest.approx(0.001)
    few_prompts = {"decode-0-1": lines["decode-0-1"][:64]}  # 4 steps with prompt tokens: the idle factor is kept
    assert set(steps.step_factors(profile, few_prompts)) == {"step_factor", "per_served_row_s"}
    assert steps.step_factors(profile, {"decode-0-1": lines["decode-0-1"][:10]}) is None  # too few to fit


def test_the_round_gap_is_the_mean_of_a_busy_loops_gaps_an_idle_wait_left_out():
    # Steps of 10 ms, 0.3, 0.3, 0.3 and 1.5 ms apart, then 2 s idle: the simulator charges the gap once a step, so
    # the streams' time is their sum, the mean's (the median, 0.3 ms, put the 2026-11-28 passes' TPOT 1-3% short).
    lines = {"decode-0-1": [{"t": t, "s": 0.01} for t in (0.0, 0.0103, 0.0206, 0.0309, 0.0424, 2.0424)]}
    assert steps.round_gap(lines) == pytest.approx(0.0006)


def test_steps_that_all_stream_as_many_tokens_get_a_factor_only():
    """One batch size throughout: a time per token cannot be told from the factor, so all of it is the factor."""
    profile = _profile()
    decode = StepShape.decode(8, 300)
    lines = {"decode-0-1": _worker(profile, [(decode, 0)] * 40, lambda *_: 1.3)}
    assert steps.step_factors(profile, lines) == {"step_factor": pytest.approx(1.3), "per_served_row_s": 0.0}


def test_large_batches_served_below_their_price_get_a_negative_time_per_row_bounded_by_the_rows_price():
    """A profile that prices each row 0.5 ms above what serving takes: the fit takes it off, and no more than the
    profile's own price of a row (1 ms)."""
    profile = _profile()
    row = steps.row_price(profile)
    shapes = [(StepShape.decode(rows, 300), 0) for rows in (1, 4, 8, 16, 24)] * 10

    def served_at(per_row):
        return lambda t, shape, _: 1 + per_row * shape.sampled_rows / profile.step_seconds(shape)

    fitted = steps.step_factors(profile, {"decode-0-1": _worker(profile, shapes, served_at(-0.0005))})
    assert fitted == {"step_factor": pytest.approx(1.0), "per_served_row_s": pytest.approx(-0.0005)}
    lower = steps.step_factors(profile, {"decode-0-1": _worker(profile, shapes, served_at(-2 * row))})
    assert lower["per_served_row_s"] == pytest.approx(-row)


def test_a_profile_whose_one_row_band_costs_more_than_the_next_still_gets_its_fit():
    """Its 2-row step priced below its 1-row one (1- and 2-row steps measured alike, the fit's bands took the
    difference): a row's price is that of a row, not of the band, and the fit starts inside its bounds."""
    base = _profile()
    bands = ((1, 0.004), (2, 0.001), (5, 0.0))
    profile = dataclasses.replace(base, step=dataclasses.replace(base.step, kernel_bands=bands))
    assert profile.step_seconds(StepShape.decode(2, 0)) < profile.step_seconds(StepShape.decode(1, 0))
    assert steps.row_price(profile) == pytest.approx(steps.row_price(base)) and steps.row_price(base) > 0
    shapes = [(StepShape.decode(rows, 300), 0) for rows in (1, 2, 4, 8, 16)] * 12
    lines = {"decode-0-1": _worker(profile, shapes, lambda *_: 1.2)}
    assert steps.step_factors(profile, lines) == {"step_factor": pytest.approx(1.2),
                                                  "per_served_row_s": pytest.approx(0.0, abs=1e-9)}  # fmt: skip


def test_steps_the_vm_stalled_are_left_out_of_the_fit():
    """Five of 60 steps served at 3x their time (a stalled VM) would pull a least-squares factor to ~1.3."""
    profile = _profile()
    shapes = [(StepShape.decode(rows, 300), 0) for rows in (1, 2, 4, 8)] * 15
    stalled = {3, 17, 30, 44, 58}
    lines = _worker(profile, shapes, lambda *_: 1.1)
    for i in stalled:
        lines[i]["s"] *= 3
    fitted = steps.step_factors(profile, {"decode-0-1": lines})
    assert fitted == {"step_factor": pytest.approx(1.1), "per_served_row_s": pytest.approx(0.0, abs=1e-9)}


def test_several_workers_get_the_line_from_a_step_alone_to_one_beside_a_stepping_neighbour():
    profile = _profile()
    decode = StepShape.decode(4, 200)
    busy_b = _worker(profile, [(decode, 0)] * 40, lambda *_: 1.0, start=0.0, pause_every=10, pause_s=2.0)

    def stepping(t):  # whether worker b is inside a step at t
        return any(s["t"] <= t < s["t"] + s["s"] for s in busy_b)

    a = _worker(profile, [(decode, 0)] * 200, lambda t, *_: 1.3 if stepping(t) else 1.0, start=0.0)
    fitted = steps.step_factors(profile, {"decode-0-1": a, "decode-1-2": busy_b})
    # b's own steps: beside a for most of them, at 1.0: the line pulls them in, so a's ends are not exact
    assert fitted["alone_step_factor"] == pytest.approx(1.0, abs=0.06)
    assert fitted["step_factor"] > fitted["alone_step_factor"] + 0.1
    assert steps.overlap(a[0], [busy_b]) > 0.9 and steps.overlap(a[-1], [busy_b]) == 0.0  # b long done by then


def test_a_record_with_the_loads_steps_is_fitted_from_them_and_kept_with_them(tmp_path):
    profile = _profile()
    idle, requests, loaded = _outcomes(profile, 1, 0.02, 0.05)
    lines = {"decode-0-1": _worker(profile, [(StepShape.decode(6, 400), 0)] * 40, lambda *_: 1.25, gap=0.002)}
    record = CalibrationRecord(1, idle, requests, loaded, loaded_steps=lines)
    fitted = calibration.fitted(profile, record)
    assert fitted.serving.step_factor == pytest.approx(1.25) and fitted.serving.per_round_s == pytest.approx(0.002)
    assert "from 40 served steps of the load" in fitted.notes[-1]
    record.save(tmp_path / "calibration.json")
    assert CalibrationRecord.load(tmp_path / "calibration.json") == record
    without = calibration.fitted(profile, CalibrationRecord(1, idle, requests, loaded))  # an older record
    assert without.serving.step_factor == 1.0 and "solved from the load's TPOT" in without.notes[-1]
