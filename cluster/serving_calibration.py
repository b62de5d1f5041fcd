"""What serving adds around the engine's steps on this machine, measured on a real `tandem serve`.

    profile = calibrate(profile, worker)      # the same profile, its `ServingCost` measured

A deployment of the profile's worker kind fills the host (colocated workers of its threads, as many as the
cores take), started on an embedded Ray, and a client of our own (token-id prompts, the response's phases)
drives it in phases:

  idle      one request at a time, half before the load and half after it (the VM drifts within minutes:
            five in a row gave prefill factors of 0.97-1.32 between passes): the router's and the hops'
            share of the time to first token is what is left of it after the prefill the worker measured
            and the arrival window (`request_s`); that prefill against the profile's price of its step gives
            `prefill_factor` (prompt tokens are compute-bound: the factor for them is not the decode
            steps');
  beside    with several workers, first, in a deployment of its own (`cluster.calibration_beside`): prompts
            prefilled on one worker while another decodes a long stream, each against its quiet twin just
            after, give the line of `prompt_contention_s` and `prompt_contention_per_token_s`, and the
            stream's time per token while they prefill against before them `beside_prefill_factor`; the
            quiet twins (on a prefill worker) against their price at the idle prefill factor give the line
            of `kv_send_s` and `kv_send_per_token_s`, a prefill worker's time for streaming its KV out;
  loaded    Poisson arrivals at about half the pool's capacity, then a burst (batches of 1-16 rows a worker,
            where the Poisson load steps 1-4), every worker tracing its engine steps
            (`runtime.step_trace`): each served step against its profiled price gives the step factors, the
            time between two steps `per_round_s` (`cluster.calibration_steps`): with one worker
            `step_factor` for decode rows and `prefill_factor` for prompt tokens under load, with several
            the line from `alone_step_factor` (no other worker inside a step) to `step_factor` (all of them).
            The note says what the simulator makes of the load's TPOT on the fitted costs, against the
            served one.

Before the steps were traced (records without them: `_fitted_to_tpot`), the loaded phase's mean TPOT was
matched by bisection on the simulation: with one worker by a time per step (`per_round_s`), with several by
`step_factor`, the time per step then solved from the idle TPOT with `alone_step_factor` 1.0. The served
steps showed why that missed (`cluster.calibration_steps`' module doc): serving slows the steps themselves.

About two minutes on 2 cores, besides the deployments' starts; up to `CALIBRATIONS` times that where the
machine moved under it (`steadiest`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable

from cluster import calibration_beside, calibration_steps
from cluster.calibration_client import Outcome, drive, one, prompt
from cluster.calibration_record import CalibrationRecord
from costmodel import Profile, ServingCost, StepShape
from planner.workload import SimRequest, WorkloadSpec
from runtime import step_trace

IDLE_REQUESTS, IDLE_PROMPT, IDLE_OUTPUT = 10, 256, 32
NOTE_START = "serving calibrated"
LOAD = dict(num_prompts=24, random_input_len=384, random_output_len=96, seed=5, ignore_eos=True)
# After the Poisson arrivals, a burst: batches of up to BURST_PER_WORKER rows, shrinking as their outputs end
# (lengths spread over 16-112 tokens), so the fit sees the large batches a load of 1-4 rows never steps.
BURST_PER_WORKER = 16
BURST = dict(random_input_len=128, random_output_len=64, random_range_ratio=0.75, seed=6, ignore_eos=True)
BURST_AFTER_S = 2.0  # the burst arrives this long after the load's last request
# The idle prefills (the same work each time) of the 17 calibrations of 2026-11-27/28 on a quiet VM spread by
# 1.04-1.17x (`CalibrationRecord.idle_prefill_spread`); the 7 the VM disturbed by 1.37-1.72x, and one of them
# priced every run of its layout after it 2-3x too slow (TTFT +182..+241%): the machine it measured was gone.
# Such a calibration is measured again, CALIBRATIONS times in all at most, and the steadiest kept.
STEADY_SPREAD = 1.25
CALIBRATIONS = 3


def calibrate(profile: Profile, model: str | None, replicas: int, on_progress: Callable[[str], None] = print,
              record_to: str | Path | None = None, engine: dict | None = None) -> Profile:  # fmt: skip
    """`profile` with the serving costs measured on `replicas` colocated workers of its kind (see the module doc),
    measured again when the machine moved under it (`steadiest`); what was measured is also written to
    `record_to` (a `CalibrationRecord`), when given. `engine`: the knobs the profile was measured with (the
    spec's `engine` section, `planner.local_profile.engine_spec`), which every deployment of the calibration serves
    with; None: the defaults."""
    record = steadiest(lambda: _measured(profile, model, replicas, on_progress, engine or {}), on_progress)
    if record_to is not None:
        record.save(record_to)
    return fitted(profile, record)


def steadiest(measure: Callable[[], CalibrationRecord], on_progress: Callable[[str], None] = print,
              ) -> CalibrationRecord:  # fmt: skip
    """A calibration `measure`d, and measured again while its idle prefills spread past `STEADY_SPREAD` (the
    machine moved under it), `CALIBRATIONS` times at most; the steadiest of them."""
    kept = measure()
    for attempt in range(2, CALIBRATIONS + 1):
        spread = kept.idle_prefill_spread()
        if spread is None or spread <= STEADY_SPREAD:
            break
        on_progress(f"serving calibration: its idle prefills spread {spread:.2f}x (a steady machine's at most "
                    f"{STEADY_SPREAD}x): measuring it again ({attempt} of {CALIBRATIONS})")  # fmt: skip
        kept = min(kept, measure(), key=lambda r: r.idle_prefill_spread() or 1.0)
    return kept


def _measured(profile: Profile, model: str | None, replicas: int, on_progress: Callable[[str], None],
              engine: dict) -> CalibrationRecord:  # fmt: skip
    """Every phase measured once, on deployments started for it (see the module doc)."""
    import ray

    from cluster.deployment import connect_ray

    with tempfile.TemporaryDirectory(prefix="tandem-calibration-") as traces, _step_traces_to(traces):
        connect_ray(None)  # the embedded Ray's workers inherit TANDEM_STEP_TRACE from here
        try:
            beside = None
            if replicas > 1:
                spec = calibration_beside.beside_spec(model, profile.torch_threads, replicas, engine)
                beside = calibration_beside.beside_phase(spec, profile.model.vocab_size, on_progress=on_progress)
            idle, requests, loaded, window = _colocated_phases(profile, model, replicas, on_progress, engine)
        finally:
            ray.shutdown()
        steps = calibration_steps.loaded_steps(traces, *window)
    return CalibrationRecord(replicas, idle, requests, loaded, beside, steps)


@contextlib.contextmanager
def _step_traces_to(folder: str):
    """`runtime.step_trace` on in every worker started meanwhile, into `folder`; the variable as it was after."""
    before = os.environ.get(step_trace.ENV)
    os.environ[step_trace.ENV] = folder
    try:
        yield
    finally:
        if before is None:
            del os.environ[step_trace.ENV]
        else:
            os.environ[step_trace.ENV] = before


def colocated_spec(model: str | None, replicas: int, threads: int, engine: dict):
    """`replicas` colocated workers of `threads` threads serving with the knobs `engine` (a spec's section)."""
    from cluster.spec import parse_spec

    return parse_spec({"model": model, "engine": engine, "router": {"port": 0}, "prefill": {"replicas": 0},
                       "decode": {"replicas": replicas, "torch_threads": threads}})  # fmt: skip


def _colocated_phases(profile: Profile, model: str | None, replicas: int, on_progress: Callable[[str], None],
                      engine: dict,
                      ) -> tuple[list[Outcome], list[SimRequest], list[Outcome], tuple[float, float]]:  # fmt: skip
    """The idle and loaded phases on `replicas` colocated workers: (idle outcomes, the load, its outcomes, when
    the load ran: monotonic start and end)."""
    from cluster.deployment import Deployment

    spec = colocated_spec(model, replicas, profile.torch_threads, engine)
    on_progress(f"serving calibration: starting {replicas} colocated worker(s) of {profile.torch_threads} thread(s)")
    deployment = Deployment(spec)
    try:
        deployment.start()
        server = (f"{deployment.url}/v1/completions", deployment.config.model_name)

        def one_at_a_time(seeds: range) -> list[Outcome]:
            return [one(server, prompt(IDLE_PROMPT, i, profile.model.vocab_size), IDLE_OUTPUT) for i in seeds]

        on_progress("serving calibration: one request at a time")
        half = IDLE_REQUESTS // 2  # half of them before the load, half after: the VM drifts within minutes
        idle = one_at_a_time(range(half))
        requests = _load(profile, replicas)
        on_progress(f"serving calibration: {len(requests)} requests at {len(requests) / requests[-1].arrival_s:.2f}/s")
        start = time.monotonic()
        loaded = drive(server, requests)
        window = (start, time.monotonic())
        on_progress("serving calibration: one request at a time, again")
        idle += one_at_a_time(range(half, IDLE_REQUESTS))
    finally:
        deployment.stop()
    return idle, requests, loaded, window


def fitted(profile: Profile, record: CalibrationRecord) -> Profile:
    """`profile` with its serving costs fitted to what a calibration measured (`record`): now, or again later
    from a kept record after the model changed. Serving's time around the steps and their factors come from
    the loaded phase's steps (`cluster.calibration_steps`) where the record has them, else solved from TPOTs
    (`_fitted_to_tpot`: records of before the steps were kept)."""
    from runtime.arrival_window import ArrivalWindowConfig

    replicas, idle, beside = record.replicas, record.idle, record.beside
    serving = profile.serving
    ttft = statistics.median(o.ttft for o in idle)
    prefill = statistics.median(o.phases.get("prefill_s", 0.0) for o in idle)
    request_s = max(0.0, ttft - prefill - ArrivalWindowConfig().quiet_s - 2 * serving.message_s)
    profiled_prefill = profile.step_seconds(StepShape.prefill(IDLE_PROMPT))
    prefill_factor = prefill / profiled_prefill if prefill > 0 else None  # no phases: the step factors throughout
    serving = dataclasses.replace(serving, request_s=request_s, step_factor=1.0, alone_step_factor=None,
                                  prefill_factor=prefill_factor)  # fmt: skip
    beside_prefill_factor = calibration_beside.beside_prefill_factor(profile, beside) if beside else None
    serving = dataclasses.replace(serving, **calibration_beside.prompt_contention(beside or []),
                                  **calibration_beside.kv_send(profile, beside or [], prefill_factor),
                                  beside_prefill_factor=beside_prefill_factor)  # fmt: skip
    factors = calibration_steps.step_factors(profile, record.loaded_steps) if record.loaded_steps else None
    if factors is not None:
        gap = calibration_steps.round_gap(record.loaded_steps)
        serving = dataclasses.replace(serving, **factors, per_round_s=serving.per_round_s if gap is None else gap)
        if serving.beside_prefill_factor is not None and serving.alone_step_factor is not None:
            # measured as 1 + the stream's extra time per token over its quiet second: its base is now measured too
            serving = dataclasses.replace(serving, beside_prefill_factor=serving.beside_prefill_factor - 1.0
                                          + serving.alone_step_factor)  # fmt: skip
        loaded_fit = ", ".join(f"{k} {v * 1e3:.2f} ms" if k.endswith("_s") else f"{k} {v:.3f}"
                               for k, v in factors.items()) + \
            f", per_round_s {serving.per_round_s * 1e3:.1f} ms (from {sum(map(len, record.loaded_steps.values()))} " \
            f"served steps of the load)"  # fmt: skip
    else:
        serving, loaded_fit = _fitted_to_tpot(profile, serving, record)
    real_tpot = _mean_tpot(record.loaded)
    check = _simulated_tpot(dataclasses.replace(profile, serving=serving), replicas, record.requests)
    prompt_fit = "" if prefill_factor is None else \
        f"prefill_factor {prefill_factor:.3f} idle (profiled {profiled_prefill * 1e3:.0f} ms), "
    if beside:
        prompt_fit += (f"prompt_contention_s {serving.prompt_contention_s * 1e3:.1f} ms + "
                       f"{serving.prompt_contention_per_token_s * 1e6:.1f} us a prompt token beside a decoding "
                       f"worker ({calibration_beside.summary(beside)}), ")  # fmt: skip
    if beside:
        prompt_fit += (f"kv_send_s {serving.kv_send_s * 1e3:.1f} ms + {serving.kv_send_per_token_s * 1e6:.1f} us "
                       f"a prompt token on a prefill worker, ")  # fmt: skip
    if serving.beside_prefill_factor is not None:
        prompt_fit += f"beside_prefill_factor {serving.beside_prefill_factor:.3f}, "
    spread = record.idle_prefill_spread()
    steadiness = "" if spread is None else f", idle prefills spread {spread:.2f}x"
    note = (f"{NOTE_START} on {replicas} colocated worker(s): request_s {request_s * 1e3:.1f} ms (idle TTFT "
            f"{ttft * 1e3:.0f} ms, its prefill {prefill * 1e3:.0f} ms{steadiness}), {prompt_fit}{loaded_fit}; the "
            f"load's TPOT served {real_tpot * 1e3:.1f} ms, simulated on these {check * 1e3:.1f} ms")  # fmt: skip
    kept = tuple(n for n in profile.notes if not n.startswith(NOTE_START))  # an earlier calibration's note goes
    return dataclasses.replace(profile, serving=serving, notes=(*kept, note))


def _fitted_to_tpot(profile: Profile, serving: ServingCost, record: CalibrationRecord) -> tuple[ServingCost, str]:
    """Serving's time per step and the steps' factors solved from TPOTs, for a record without the loaded
    phase's steps: with several workers `per_round_s` from the idle TPOT (no neighbour contending:
    `alone_step_factor` 1.0) and `step_factor` from the loaded one; with one worker `per_round_s` from the
    loaded TPOT. (What the served steps showed: the module doc of `cluster.calibration_steps`.)"""
    replicas, idle, requests = record.replicas, record.idle, record.requests
    alone = ""
    if replicas > 1:  # serving's own time around each step, measured where no neighbour contends
        idle_tpot = _mean_tpot(idle)
        serving = dataclasses.replace(serving, alone_step_factor=1.0)

        def alone_tpot(per_round_s: float) -> float:
            trial = dataclasses.replace(profile, serving=dataclasses.replace(serving, per_round_s=per_round_s))
            return _simulated_tpot(trial, replicas, _one_at_a_time(len(idle)))

        serving = dataclasses.replace(serving, per_round_s=_solved(alone_tpot, idle_tpot, 0.0, 0.1))
        alone = f", per_round_s {serving.per_round_s * 1e3:.1f} ms (served TPOT {idle_tpot * 1e3:.1f} ms idle)"
    real_tpot = _mean_tpot(record.loaded)
    # Several workers contend for the host: a share of every step. One worker: serving's own time per step.
    name, low, high = ("step_factor", 1.0, 8.0) if replicas > 1 else ("per_round_s", 0.0, 0.1)

    def simulated(value: float) -> float:
        trial = dataclasses.replace(serving, **{name: value})
        return _simulated_tpot(dataclasses.replace(profile, serving=trial), replicas, requests)

    reachable = simulated(low) <= real_tpot <= simulated(high)
    serving = dataclasses.replace(serving, **{name: _solved(simulated, real_tpot, low, high)})
    loaded_fit = (f"step_factor {serving.step_factor:.3f}" if replicas > 1
                  else f"per_round_s {serving.per_round_s * 1e3:.1f} ms")  # fmt: skip
    if not reachable:  # the served TPOT is outside what the search reaches: say so, do not pass a bound as a fit
        loaded_fit += f" (a bound of its search [{low:g}, {high:g}]: the served TPOT lies beyond it)"
    return serving, f"{loaded_fit} solved from the load's TPOT{alone}"


def _solved(simulated: Callable[[float], float], target: float, low: float, high: float) -> float:
    """The value in [low, high] whose simulated TPOT is `target`, by bisection: the TPOT grows with either
    value, but not in proportion (slower steps overlap more of the neighbours' work and queue more)."""
    for _ in range(20):
        middle = (low + high) / 2
        low, high = (middle, high) if simulated(middle) < target else (low, middle)
    return (low + high) / 2


def _simulated_tpot(profile: Profile, replicas: int, requests: list[SimRequest]) -> float:
    from planner.layout import Layout, PoolLayout
    from planner.sim.run import simulate

    result = simulate(Layout(PoolLayout(0, None), PoolLayout(replicas, profile)), requests)
    return _mean_tpot(result.requests)


def _mean_tpot(outcomes) -> float:
    tpots = [(o.latency - o.ttft) / len(o.itl) for o in outcomes if o.success and o.itl]
    if not tpots:
        raise RuntimeError("serving calibration: no request of the load completed")
    return statistics.mean(tpots)


def _load(profile: Profile, replicas: int) -> list[SimRequest]:
    """The loaded phase's requests: Poisson arrivals at about half the pool's capacity as the profile prices
    it, then a burst of `BURST_PER_WORKER` requests a worker."""
    prompt, output = LOAD["random_input_len"], LOAD["random_output_len"]
    per_request = profile.step_seconds(StepShape.prefill(prompt)) + output * profile.step_seconds(
        StepShape.decode(4, prompt + output // 2)) / 4  # fmt: skip
    rate = 0.5 * replicas / per_request
    poisson = WorkloadSpec(request_rate=rate, **LOAD).requests(profile.model.vocab_size)
    burst = WorkloadSpec(num_prompts=BURST_PER_WORKER * replicas, **BURST).requests(profile.model.vocab_size)
    at = poisson[-1].arrival_s + BURST_AFTER_S
    return poisson + [dataclasses.replace(r, arrival_s=at + r.arrival_s) for r in burst]


def _one_at_a_time(count: int) -> list[SimRequest]:
    """The idle phase's requests as the simulator takes them: far enough apart that none meets another."""
    return [SimRequest(i * 1000.0, tuple(prompt(IDLE_PROMPT, i)), IDLE_OUTPUT) for i in range(count)]
