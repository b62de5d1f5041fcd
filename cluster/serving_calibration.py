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
            steps'); with several workers, its TPOT against the simulator's gives `per_round_s`, serving's
            own time around each step (its I/O thread, the router on the same cores), with no neighbour
            contending (`alone_step_factor` 1.0);
  beside    with several workers, first: one long stream decoding on one worker, alone for a second, then
            prompts of two lengths prefilled one at a time on another (a new prompt goes to the worker that
            remembers the fewest blocks: the stream's long prompt keeps the probes off its worker); what
            their prefill takes over the simulator's price of it alone gives the line of
            `prompt_contention_s` and `prompt_contention_per_token_s` (a short prompt feels a decoding
            neighbour most), and the stream's time per token while they prefill against before them gives
            `beside_prefill_factor` (a decode step beside a prefilling worker);
  loaded    Poisson arrivals at about half the pool's capacity: its mean TPOT against the simulator's on the
            same requests gives, with several workers, `step_factor` (the served step over the profiled one
            while the host's other workers step too: they contend for its cores and memory), and with one
            worker `per_round_s`. Serving's overhead is a time per step, not a share of it: against the four
            real loads of bench_plan's run of 2026-11-26 17:52, a factor on the lone worker's every step
            (1.40) over-predicted TPOT p50 by 10-69%, an added 6 ms a step missed by 6% at most; with several
            workers, a factor fitted one request at a time (1.30) over-predicted the TPOT of batches of 12 by
            16-28% (2026-11-26 19:56-20:47). Each value is found by bisection on the simulation.

About a minute and a half on 2 cores, besides the deployment's start.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Callable

from costmodel import Profile, ServingCost, StepShape
from planner.workload import SimRequest, WorkloadSpec

IDLE_REQUESTS, IDLE_PROMPT, IDLE_OUTPUT = 10, 256, 32
NOTE_START = "serving calibrated"
BESIDE_STREAM_PROMPT, BESIDE_STREAM_OUTPUT = 1536, 1000  # closed once the probes are done
BESIDE_PROBES = (128, 128, 128, 768, 768)  # short ones first: the probes' blocks stay below the stream's
BESIDE_QUIET_S = 1.0  # the stream alone before the probes: its time per token with no neighbour at work
LOAD = dict(num_prompts=24, random_input_len=384, random_output_len=96, seed=5, ignore_eos=True)


@dataclass
class BesideAStream:
    """The `beside` phase: the long stream (closed after the probes) and the probes prefilled beside it."""

    stream: "Outcome"
    probes: list["Outcome"]


@dataclass
class Outcome:
    """One request as our client saw it (`planner.bench_metrics.RequestOutput`'s fields), with its phases."""

    prompt_len: int
    start_time: float = 0.0
    success: bool = False
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    phases: dict = field(default_factory=dict)


def calibrate(profile: Profile, model: str | None, replicas: int, on_progress: Callable[[str], None] = print) -> Profile:
    """`profile` with the serving costs measured on `replicas` colocated workers of its kind (see the module doc)."""
    import ray

    from cluster.deployment import Deployment, connect_ray
    from cluster.spec import parse_spec

    spec = parse_spec({"model": model, "router": {"port": 0}, "prefill": {"replicas": 0},
                       "decode": {"replicas": replicas, "torch_threads": profile.torch_threads}})  # fmt: skip
    on_progress(f"serving calibration: starting {replicas} colocated worker(s) of {profile.torch_threads} thread(s)")
    connect_ray(None)
    deployment = Deployment(spec)
    try:
        deployment.start()
        server = (f"{deployment.url}/v1/completions", deployment.config.model_name)
        beside = None
        if replicas > 1:
            on_progress("serving calibration: prompts beside a decoding worker")
            beside = _beside_a_stream(server)
        on_progress("serving calibration: one request at a time")
        half = IDLE_REQUESTS // 2  # half of them before the load, half after: the VM drifts within minutes
        idle = [_one(server, _prompt(IDLE_PROMPT, seed=i), IDLE_OUTPUT) for i in range(half)]
        requests = _load(profile, replicas)
        on_progress(f"serving calibration: {len(requests)} requests at {len(requests) / requests[-1].arrival_s:.2f}/s")
        loaded = _drive(server, requests)
        on_progress("serving calibration: one request at a time, again")
        idle += [_one(server, _prompt(IDLE_PROMPT, seed=i), IDLE_OUTPUT) for i in range(half, IDLE_REQUESTS)]
    finally:
        deployment.stop()
        ray.shutdown()
    return _fitted(profile, replicas, idle, requests, loaded, beside)


def _fitted(profile: Profile, replicas: int, idle: list[Outcome], requests: list[SimRequest],
            loaded: list[Outcome], beside: BesideAStream | None = None) -> Profile:  # fmt: skip
    from runtime.arrival_window import ArrivalWindowConfig

    serving = profile.serving
    ttft = statistics.median(o.ttft for o in idle)
    prefill = statistics.median(o.phases.get("prefill_s", 0.0) for o in idle)
    request_s = max(0.0, ttft - prefill - ArrivalWindowConfig().quiet_s - 2 * serving.message_s)
    profiled_prefill = profile.step_seconds(StepShape.prefill(IDLE_PROMPT))
    prefill_factor = prefill / profiled_prefill if prefill > 0 else None  # no phases: the step factors throughout
    serving = dataclasses.replace(serving, request_s=request_s, step_factor=1.0, alone_step_factor=None,
                                  prefill_factor=prefill_factor)  # fmt: skip
    beside_prefill_factor = _beside_prefill_factor(profile, beside) if beside else None
    serving = dataclasses.replace(serving, **_prompt_contention(profile, prefill_factor, beside),
                                  beside_prefill_factor=beside_prefill_factor)  # fmt: skip
    alone = ""
    if replicas > 1:  # serving's own time around each step, measured where no neighbour contends
        idle_tpot = _mean_tpot(idle)
        serving = dataclasses.replace(serving, alone_step_factor=1.0)

        def alone_tpot(per_round_s: float) -> float:
            trial = dataclasses.replace(profile, serving=dataclasses.replace(serving, per_round_s=per_round_s))
            return _simulated_tpot(trial, replicas, _one_at_a_time(len(idle)))

        serving = dataclasses.replace(serving, per_round_s=_solved(alone_tpot, idle_tpot, 0.0, 0.1))
        alone = f", per_round_s {serving.per_round_s * 1e3:.1f} ms (served TPOT {idle_tpot * 1e3:.1f} ms idle)"
    real_tpot = _mean_tpot(loaded)
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
    prompt_fit = "" if prefill_factor is None else \
        f"prefill_factor {prefill_factor:.3f} (profiled {profiled_prefill * 1e3:.0f} ms), "
    if beside:
        prompt_fit += (f"prompt_contention_s {serving.prompt_contention_s * 1e3:.1f} ms + "
                       f"{serving.prompt_contention_per_token_s * 1e6:.1f} us a prompt token beside a decoding "
                       f"worker ({_beside_summary(beside.probes)}), ")  # fmt: skip
    if serving.beside_prefill_factor is not None:
        prompt_fit += f"beside_prefill_factor {serving.beside_prefill_factor:.3f}, "
    note = (f"{NOTE_START} on {replicas} colocated worker(s): request_s {request_s * 1e3:.1f} ms (idle TTFT "
            f"{ttft * 1e3:.0f} ms, its prefill {prefill * 1e3:.0f} ms), {prompt_fit}{loaded_fit} (served TPOT "
            f"{real_tpot * 1e3:.1f} ms under load){alone}")  # fmt: skip
    kept = tuple(n for n in profile.notes if not n.startswith(NOTE_START))  # an earlier calibration's note goes
    return dataclasses.replace(profile, serving=serving, notes=(*kept, note))


def _prompt_contention(profile: Profile, prefill_factor: float | None,
                       beside: BesideAStream | None) -> dict[str, float]:  # fmt: skip
    """The line through the median extra prefill time of the short and of the long probes beside a decoding
    worker (over the simulator's price of each alone), neither term below 0; both 0 without probes."""
    extra: dict[int, list[float]] = {}
    for o in beside.probes if beside else ():
        if o.phases.get("prefill_s"):
            alone = profile.step_seconds(StepShape.prefill(o.prompt_len)) * (prefill_factor or 1.0)
            extra.setdefault(o.prompt_len, []).append(o.phases["prefill_s"] - alone)
    if len(extra) < 2:
        return {"prompt_contention_s": 0.0, "prompt_contention_per_token_s": 0.0}
    lengths = sorted(extra)
    short, long = lengths[0], lengths[-1]
    short_extra, long_extra = statistics.median(extra[short]), statistics.median(extra[long])
    per_token = max(0.0, (long_extra - short_extra) / (long - short))
    step = max(0.0, short_extra - per_token * short)
    if step == 0.0:  # the line crosses 0 above the short probe: through the long one's median from the origin
        per_token = max(0.0, long_extra / long)
    return {"prompt_contention_s": step, "prompt_contention_per_token_s": per_token}


def _beside_prefill_factor(profile: Profile, beside: BesideAStream) -> float | None:
    """The stream's time per token while the probes were prefilled over its time alone (the quiet second
    before them): 1 + the difference over the profiled step of its one row, at least 1; None when too few of
    its tokens fell in either (a token's time: the gap that ended with it, counted beside a prefill when the
    whole gap lies inside one)."""
    tokens = _token_times(beside.stream)
    gaps = list(zip(tokens[1:], beside.stream.itl))  # (when a token arrived, the gap before it)
    prefills = [(o.start_time + o.ttft - o.phases["prefill_s"], o.start_time + o.ttft)
                for o in beside.probes if o.success and o.phases.get("prefill_s")]  # fmt: skip
    alone = [gap for at, gap in gaps if at <= tokens[0] + BESIDE_QUIET_S]
    during = [gap for at, gap in gaps if any(start <= at - gap and at <= end for start, end in prefills)]
    if len(alone) < 5 or len(during) < 5:
        return None
    step = profile.step_seconds(StepShape.decode(1, BESIDE_STREAM_PROMPT + len(alone)))
    return max(1.0, 1.0 + (statistics.mean(during) - statistics.mean(alone)) / step)


def _token_times(outcome: Outcome) -> list[float]:
    """When each token of `outcome` arrived (its client's clock)."""
    if not outcome.success:
        return []
    times = [outcome.start_time + outcome.ttft]
    for gap in outcome.itl:
        times.append(times[-1] + gap)
    return times


def _beside_summary(beside: list[Outcome]) -> str:
    by_length: dict[int, list[float]] = {}
    for o in beside:
        by_length.setdefault(o.prompt_len, []).append(o.phases.get("prefill_s", 0.0))
    return ", ".join(f"{n} tokens prefilled in {statistics.median(t) * 1e3:.0f} ms" for n, t in sorted(by_length.items()))


def _beside_a_stream(server: tuple[str, str]) -> BesideAStream:
    """One long stream decoding on one worker, alone for `BESIDE_QUIET_S`, then the probes prefilled one at a
    time on another (see the module doc); the stream is closed when they are done."""
    started, done = threading.Event(), threading.Event()
    streamed: list[Outcome] = []

    def stream() -> None:
        prompt = _prompt(BESIDE_STREAM_PROMPT, seed=-1)
        streamed.append(_one(server, prompt, BESIDE_STREAM_OUTPUT, first_token=started, stop=done))

    thread = threading.Thread(target=stream, daemon=True)
    thread.start()
    try:
        if not started.wait(120):
            raise RuntimeError("serving calibration: the background stream sent no token in 120 s")
        time.sleep(BESIDE_QUIET_S)
        probes = [_one(server, _prompt(n, seed=100 + i), 2) for i, n in enumerate(BESIDE_PROBES)]
    finally:
        done.set()
        thread.join(60)
    if not streamed:
        raise RuntimeError("serving calibration: the background stream did not end when asked")
    return BesideAStream(streamed[0], probes)


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
    """The loaded phase's requests, at about half the pool's capacity as the profile prices it."""
    prompt, output = LOAD["random_input_len"], LOAD["random_output_len"]
    per_request = profile.step_seconds(StepShape.prefill(prompt)) + output * profile.step_seconds(
        StepShape.decode(4, prompt + output // 2)) / 4  # fmt: skip
    rate = 0.5 * replicas / per_request
    return WorkloadSpec(request_rate=rate, **LOAD).requests(profile.model.vocab_size)


def _one_at_a_time(count: int) -> list[SimRequest]:
    """The idle phase's requests as the simulator takes them: far enough apart that none meets another."""
    return [SimRequest(i * 1000.0, tuple(_prompt(IDLE_PROMPT, i)), IDLE_OUTPUT) for i in range(count)]


def _prompt(n: int, seed: int) -> list[int]:
    import random

    rng = random.Random(1000 + seed)
    return [rng.randrange(1000, 30000) for _ in range(n)]


def _drive(server: tuple[str, str], requests: list[SimRequest]) -> list[Outcome]:
    """Each request sent at its arrival time (a thread each), streamed; their outcomes in order."""
    outcomes: list[Outcome | None] = [None] * len(requests)
    start = time.monotonic()

    def send(i: int, request: SimRequest) -> None:
        time.sleep(max(0.0, start + request.arrival_s - time.monotonic()))
        outcomes[i] = _one(server, list(request.prompt), request.output_len)

    threads = [threading.Thread(target=send, args=(i, r), daemon=True) for i, r in enumerate(requests)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    return [o for o in outcomes if o is not None]


def _one(server: tuple[str, str], prompt: list[int], max_tokens: int, first_token: threading.Event | None = None,
         stop: threading.Event | None = None) -> Outcome:  # fmt: skip
    """One streamed completion of `prompt` from `server` (its URL, the model name it serves); `first_token` is
    set when its first token arrives, and once `stop` is set the stream is closed (the server aborts it)."""
    url, model = server
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    outcome = Outcome(len(prompt), start_time=time.monotonic())
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    times = []
    with urllib.request.urlopen(request, timeout=600) as response:
        for line in response:
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[len(b"data: "):])
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                times.append(time.monotonic())
                if first_token is not None:
                    first_token.set()
            if stop is not None and stop.is_set():
                break
            if chunk.get("phases"):
                outcome.phases = chunk["phases"][0]
    if times:
        outcome.success, outcome.ttft = True, times[0] - outcome.start_time
        outcome.latency, outcome.itl = times[-1] - outcome.start_time, [b - a for a, b in zip(times, times[1:])]
    return outcome
