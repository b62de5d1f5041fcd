"""The serving calibration's fit, from outcomes as its client records them (the real runs are bench_plan's)."""

from __future__ import annotations

import dataclasses

import pytest

from cluster import calibration_beside as beside
from cluster import serving_calibration as calibration
from cluster.calibration_record import CalibrationRecord
from tests.planner.profiles import hand_profile

DEFAULT = beside.BesideProbes()


def _profile():
    base = hand_profile(kv_cache_tokens=16 * 4096)
    return dataclasses.replace(base, model=dataclasses.replace(base.model, vocab_size=32000))


def _served(prompt_len: int, output_len: int, ttft: float, itl: float, phases=None):
    return calibration.Outcome(prompt_len, 0.0, True, ttft, ttft + (output_len - 1) * itl, [itl] * (output_len - 1),
                               phases or {})  # fmt: skip


def _outcomes(profile, replicas: int, idle_itl: float, loaded_itl: float):
    idle = [_served(calibration.IDLE_PROMPT, calibration.IDLE_OUTPUT, 0.3, idle_itl, {"prefill_s": 0.25})] * 5
    requests = calibration._load(profile, replicas)
    loaded = [_served(len(r.prompt), r.output_len, 0.3, loaded_itl) for r in requests]
    return idle, requests, loaded


def test_one_worker_is_fitted_a_time_per_step_that_reproduces_its_served_tpot():
    profile = _profile()
    idle, requests, loaded = _outcomes(profile, 1, 0.02, 0.05)
    fitted = calibration.fitted(profile, CalibrationRecord(1, idle, requests, loaded)).serving
    assert fitted.step_factor == 1.0 and fitted.alone_step_factor is None
    assert fitted.per_round_s > profile.serving.per_round_s
    assert fitted.request_s == pytest.approx(0.3 - 0.25 - 0.012, abs=0.002)  # TTFT - prefill - the window's quiet
    assert fitted.prefill_factor == pytest.approx(0.25 / 0.266)  # served prefill / profiled (10 ms + 256 x 1 ms)
    simulated = calibration._simulated_tpot(dataclasses.replace(profile, serving=fitted), 1, requests)
    assert simulated == pytest.approx(0.05, rel=0.02)
    record = CalibrationRecord(1, idle, requests, loaded)
    again = calibration.fitted(calibration.fitted(profile, record), record)
    assert [n for n in again.notes if n.startswith("serving calibrated")] == [again.notes[-1]]  # the latest only


def test_several_workers_are_fitted_a_time_per_step_alone_and_a_factor_beside_busy_neighbours():
    profile = _profile()
    idle, requests, loaded = _outcomes(profile, 2, 0.015, 0.05)  # alone: 4 ms a step over the profiled 11 ms
    fitted = calibration.fitted(profile, CalibrationRecord(2, idle, requests, loaded)).serving
    assert fitted.alone_step_factor == 1.0 and fitted.per_round_s == pytest.approx(0.004, abs=0.0005)
    assert fitted.step_factor > 1.2
    fitted_profile = dataclasses.replace(profile, serving=fitted)
    assert calibration._simulated_tpot(fitted_profile, 2, calibration._one_at_a_time(len(idle))) == pytest.approx(0.015, rel=0.02)
    simulated = calibration._simulated_tpot(fitted_profile, 2, requests)
    assert simulated == pytest.approx(0.05, rel=0.05)  # steep there: slower steps overlap more and queue more


def _beside(extra_short: float, extra_long: float, itl_alone: float = 0.03, itl_beside: float = 0.03):
    """Three rounds as served, 30 s apart: in each the stream's first token, a second of it alone, then the
    probes 2 s apart, each prefilled in its quiet twin's time plus `extra_*`; the machine's speed drifts
    between rounds (quiet prefill 1 ms a token at 1.0x, 1.3x, 0.8x), which the twins cancel. The stream sends
    a token every `itl_beside` while a probe is prefilled and every `itl_alone` otherwise."""
    rounds = []
    for r, drift in enumerate((1.0, 1.3, 0.8)):
        t0 = 30.0 * r

        def probe(i: int, n: int, extra: float = 0.0):
            served = drift * n * 0.001 + extra
            return calibration.Outcome(n, t0 + 10.0 + 2 * i, True, served, served + 0.01, [0.01], {"prefill_s": served})

        short, long = DEFAULT.probes[0], DEFAULT.probes[-1]
        probes = [probe(0, short, extra_short), probe(1, long, extra_long)]
        quiet = [probe(3, short), probe(4, long)]
        times = [t0 + 9.0]
        while times[-1] < t0 + 14.0:
            prefilling = any(p.start_time < times[-1] <= p.start_time + p.ttft for p in probes)
            times.append(times[-1] + (itl_beside if prefilling else itl_alone))
        stream = calibration.Outcome(DEFAULT.stream_prompt, t0, True, 9.0, times[-1] - t0,
                                     [b - a for a, b in zip(times, times[1:])])  # fmt: skip
        rounds.append(beside.BesideRound(stream, probes, quiet, alone_s=1.0))
    return rounds


def test_prompts_beside_a_decoding_worker_fit_the_line_through_their_extra_time():
    profile = _profile()
    idle, requests, loaded = _outcomes(profile, 2, 0.015, 0.05)
    fitted = calibration.fitted(profile, CalibrationRecord(2, idle, requests, loaded, _beside(0.04, 0.09)))
    assert fitted.serving.prompt_contention_per_token_s == pytest.approx(0.05 / 640)  # 128 and 768 tokens
    assert fitted.serving.prompt_contention_s == pytest.approx(0.04 - 128 * 0.05 / 640)
    assert "prompt_contention_s 30.0 ms + 78.1 us a prompt token" in fitted.notes[-1]
    # A long prompt slowed less than a short one: a time per step, none per token; none slower: nothing.
    flat = calibration.fitted(profile, CalibrationRecord(2, idle, requests, loaded, _beside(0.04, 0.02))).serving
    assert (flat.prompt_contention_s, flat.prompt_contention_per_token_s) == pytest.approx((0.04, 0.0))
    none = calibration.fitted(profile, CalibrationRecord(2, idle, requests, loaded, _beside(-0.01, -0.02))).serving
    assert (none.prompt_contention_s, none.prompt_contention_per_token_s) == (0.0, 0.0)
    # Without probes (one worker: no neighbour to measure beside) an earlier calibration's line goes too.
    again = calibration.fitted(fitted, CalibrationRecord(1, idle, calibration._load(profile, 1), loaded)).serving
    assert (again.prompt_contention_s, again.prompt_contention_per_token_s) == (0.0, 0.0)


def test_the_quiet_twins_on_the_prefill_worker_fit_the_time_it_takes_to_stream_its_kv_out():
    profile = _profile()
    idle, requests, loaded = _outcomes(profile, 2, 0.015, 0.05)
    factor = 0.25 / profile.step_seconds(calibration.StepShape.prefill(calibration.IDLE_PROMPT))  # the idle phase's
    rounds = _beside(0.04, 0.09)
    for r in rounds:  # each twin: its price at the idle factor, plus 8 ms and 30 us a token for sending its KV
        r.quiet = [dataclasses.replace(o, phases={"prefill_s": profile.step_seconds(calibration.StepShape.prefill(
            o.prompt_len)) * factor + 0.008 + 30e-6 * o.prompt_len}) for o in r.quiet]  # fmt: skip
    fitted = calibration.fitted(profile, CalibrationRecord(2, idle, requests, loaded, rounds))
    assert (fitted.serving.kv_send_s, fitted.serving.kv_send_per_token_s) == pytest.approx((0.008, 30e-6))
    assert "kv_send_s 8.0 ms + 30.0 us a prompt token on a prefill worker" in fitted.notes[-1]
    alone = calibration.fitted(profile, CalibrationRecord(1, idle, calibration._load(profile, 1), loaded)).serving
    assert (alone.kv_send_s, alone.kv_send_per_token_s) == (0.0, 0.0)  # one worker: no prefill worker measured


def test_the_stream_beside_the_prefilling_probes_fits_the_factor_of_a_decode_step_beside_a_prefill():
    profile = _profile()
    idle, requests, loaded = _outcomes(profile, 2, 0.015, 0.05)
    rounds = _beside(0.04, 0.09, itl_alone=0.030, itl_beside=0.045)
    fitted = calibration.fitted(profile, CalibrationRecord(2, idle, requests, loaded, rounds)).serving
    step = profile.step_seconds(calibration.StepShape.decode(1, DEFAULT.stream_prompt + 33))
    assert fitted.beside_prefill_factor == pytest.approx(1 + 0.015 / step, rel=0.05)
    assert "beside_prefill_factor" in calibration.fitted(profile, CalibrationRecord(2, idle, requests, loaded,
                                                                                      rounds)).notes[-1]
    unslowed = calibration.fitted(profile, CalibrationRecord(2, idle, requests, loaded, _beside(0.04, 0.09))).serving
    assert unslowed.beside_prefill_factor == pytest.approx(1.0, abs=0.02)
    alone = calibration.fitted(profile, CalibrationRecord(1, idle, calibration._load(profile, 1), loaded)).serving
    assert alone.beside_prefill_factor is None  # one worker: no neighbour to measure beside


def test_the_load_ends_in_a_burst_of_requests_for_every_worker_after_the_poisson_arrivals():
    requests = calibration._load(_profile(), 2)
    burst = requests[-2 * calibration.BURST_PER_WORKER:]
    poisson = requests[:-len(burst)]
    assert len(poisson) == calibration.LOAD["num_prompts"]
    assert {r.arrival_s for r in burst} == {poisson[-1].arrival_s + calibration.BURST_AFTER_S}
    assert min(r.output_len for r in burst) < 32 < 96 < max(r.output_len for r in burst)  # the batch shrinks


def test_a_kept_record_is_fitted_to_the_same_costs_again(tmp_path):
    """What bench_plan's --refit reads: the measurements as JSON, the fit from them the same as from the live ones."""
    profile = _profile()
    idle, requests, loaded = _outcomes(profile, 2, 0.015, 0.05)
    record = CalibrationRecord(2, idle, requests, loaded, _beside(0.04, 0.09, itl_alone=0.030, itl_beside=0.045))
    record.save(tmp_path / "calibration.json")
    again = CalibrationRecord.load(tmp_path / "calibration.json")
    assert again == record
    assert calibration.fitted(profile, again).serving == calibration.fitted(profile, record).serving


def _idle_record(prefills: list[float]) -> CalibrationRecord:
    idle = [_served(calibration.IDLE_PROMPT, calibration.IDLE_OUTPUT, p + 0.05, 0.02, {"prefill_s": p})
            for p in prefills]  # fmt: skip
    return CalibrationRecord(1, idle, [], [])


def test_the_idle_prefills_spread_says_how_far_the_machine_moved_and_one_preempted_prefill_moves_nothing():
    assert _idle_record([0.6] * 4 + [1.1] + [0.6] * 4 + [0.5]).idle_prefill_spread() == pytest.approx(1.0)
    assert _idle_record([0.6, 0.62, 0.9, 0.95, 1.0, 0.61]).idle_prefill_spread() == pytest.approx(0.95 / 0.61)
    assert CalibrationRecord(1, [_served(256, 32, 0.3, 0.02)] * 10, [], []).idle_prefill_spread() is None


@pytest.mark.parametrize("spreads, measured, kept", [
    ([1.1], 1, 1.1),  # steady: measured once
    ([1.6, 1.2], 2, 1.2),  # moved, then steady
    ([1.6, 1.8, 1.4], 3, 1.4),  # moved every time: the steadiest of CALIBRATIONS
])
def test_a_calibration_the_machine_moved_under_is_measured_again_and_the_steadiest_kept(spreads, measured, kept):
    records = iter(_idle_record([0.5] * 5 + [0.5 * s] * 5) for s in spreads)
    calls, said = [], []

    def measure() -> CalibrationRecord:
        calls.append(1)
        return next(records)

    record = calibration.steadiest(measure, said.append)
    assert len(calls) == measured == len(said) + 1 and calibration.CALIBRATIONS == 3
    assert record.idle_prefill_spread() == pytest.approx(kept)


def test_every_deployment_of_a_calibration_serves_with_the_knobs_its_profile_was_measured_with():
    from planner.layout import EngineLimits
    from planner.local_profile import engine_spec

    engine = engine_spec(EngineLimits(max_num_batched_tokens=512, quantization="none"))
    assert "max_model_len" not in engine  # None: the spec's own default
    for spec in (calibration.colocated_spec(None, 2, 1, engine), beside.beside_spec(None, 1, 2, engine)):
        assert spec.engine.max_num_batched_tokens == 512 and spec.engine.quantization == "none"
    assert calibration.colocated_spec(None, 1, 2, {}).engine.quantization == "auto"
