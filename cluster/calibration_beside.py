"""The serving calibration's `beside` phase: prompts prefilled on one worker while another on its host decodes.

    rounds = beside_phase(beside_spec(model, threads, replicas, engine), vocab_size)  # its own deployment, stopped
    serving = dataclasses.replace(serving, **prompt_contention(rounds), **kv_send(profile, rounds, prefill_factor),
                                  beside_prefill_factor=beside_prefill_factor(profile, rounds))

The deployment: one prefill worker and `replicas - 1` decode workers of the profile's kind, filling the host
as the colocated pool does. Its router sends every prompt to the prefill worker and every stream to decode,
so the probes are prefilled beside the stream by construction; a colocated pool places a new prompt on the
worker that remembers the fewest blocks, which after a few probes is the stream's own.

Each round (`BesideProbes`): one long stream decoding, alone for a second, then a prompt of each probe length
prefilled beside it, one at a time; the stream closed; the same lengths prefilled again with no
neighbour at work ("quiet twins"). A probe's contention is its prefill beside the stream less its quiet twin's
of the same round: one worker, seconds apart, so the VM's drift cancels. (The first version took the
simulator's price of the prompt times the idle phase's factor for the quiet time, from five probes in one
round: the same worker kind calibrated twice, minutes apart, gave 9.6 and 149 us a prompt token.)
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass
from typing import Callable

from cluster.calibration_client import Outcome, one, prompt
from costmodel import Profile, StepShape



@dataclass(frozen=True)
class BesideProbes:
    """What the phase sends (the defaults: for the default model on a CPU host)."""

    rounds: int = 3
    stream_prompt: int = 1536
    stream_output: int = 1000  # the stream is closed once its round's probes are done
    probes: tuple[int, ...] = (128, 768)  # a short prompt feels a decoding neighbour most: the line needs both
    quiet_s: float = 1.0  # the stream alone before the probes: its time per token with no neighbour at work
    close_s: float = 0.3  # after the stream is closed, before the quiet twins: the abort reaches its worker


@dataclass
class BesideRound:
    """One round: the stream, the probes prefilled beside it, and their quiet twins after it closed."""

    stream: Outcome
    beside: list[Outcome]
    quiet: list[Outcome]
    alone_s: float  # how long the stream ran alone before the probes


def beside_spec(model: str | None, threads: int, replicas: int, engine: dict | None = None):
    """1 prefill + `replicas - 1` decode workers of `threads` threads: the host as full as `replicas` fill it;
    `engine`: the spec's engine knobs (None: the defaults)."""
    from cluster.spec import parse_spec

    return parse_spec({"model": model, "engine": engine or {}, "router": {"port": 0},
                       "prefill": {"replicas": 1, "torch_threads": threads},
                       "decode": {"replicas": replicas - 1, "torch_threads": threads}})  # fmt: skip


def beside_phase(spec, vocab_size: int, probes: BesideProbes = BesideProbes(),
                 on_progress: Callable[[str], None] = print) -> list[BesideRound]:  # fmt: skip
    """The rounds, served by a deployment of `spec` (`beside_spec`'s) on the Ray this process is connected to
    (see the module doc); prompts of token ids below `vocab_size`."""
    from cluster.deployment import Deployment

    on_progress(f"serving calibration: prompts beside a decoding worker ({spec.prefill.replicas} prefill + "
                f"{spec.decode.replicas} decode)")  # fmt: skip
    deployment = Deployment(spec)
    try:
        deployment.start()
        server = (f"{deployment.url}/v1/completions", deployment.config.model_name)
        return [_round(server, probes, vocab_size, seed=100 + 10 * r) for r in range(probes.rounds)]
    finally:
        deployment.stop()


def _round(server: tuple[str, str], probes: BesideProbes, vocab_size: int, seed: int) -> BesideRound:
    started, done = threading.Event(), threading.Event()
    streamed: list[Outcome] = []

    def stream() -> None:  # the same prompt every round: after the first, its prefill is a cache hit
        ids = prompt(probes.stream_prompt, -1, vocab_size)
        streamed.append(one(server, ids, probes.stream_output, first_token=started, stop=done))

    def each_probe(first_seed: int) -> list[Outcome]:  # new prompts: none is in any worker's prefix cache
        return [one(server, prompt(n, first_seed + i, vocab_size), 2) for i, n in enumerate(probes.probes)]

    thread = threading.Thread(target=stream, daemon=True)
    thread.start()
    try:
        if not started.wait(120):
            raise RuntimeError("serving calibration: the background stream sent no token in 120 s")
        time.sleep(probes.quiet_s)
        beside = each_probe(seed)
    finally:
        done.set()
        thread.join(60)
    if not streamed:
        raise RuntimeError("serving calibration: the background stream did not end when asked")
    time.sleep(probes.close_s)
    quiet = each_probe(seed + len(probes.probes))
    return BesideRound(streamed[0], beside, quiet, probes.quiet_s)


def prompt_contention(rounds: list[BesideRound]) -> dict[str, float]:
    """`ServingCost`'s `prompt_contention_s` and `_per_token_s`: the line through the median extra prefill
    time (beside less quiet, round by round) of the shortest and of the longest probe (`_line`); both 0
    without rounds."""
    step, per_token = _line(_extra_prefill(rounds))
    return {"prompt_contention_s": step, "prompt_contention_per_token_s": per_token}


def kv_send(profile: Profile, rounds: list[BesideRound], prefill_factor: float | None) -> dict[str, float]:
    """`ServingCost`'s `kv_send_s` and `kv_send_per_token_s`: what the quiet twins, prefilled on the prefill
    worker with no neighbour at work, took beyond their price at `prefill_factor` (the idle phase's, measured
    on colocated workers, which stream no KV; None: 1), the line through the median of the shortest and of
    the longest probe (`_line`); both 0 without rounds. The twins' own drift is the VM's: it does not cancel
    here as it does in `prompt_contention`."""
    extra: dict[int, list[float]] = {}
    for r in rounds:
        for o in r.quiet:
            if o.success and o.phases.get("prefill_s"):
                price = profile.step_seconds(StepShape.prefill(o.prompt_len)) * (prefill_factor or 1.0)
                extra.setdefault(o.prompt_len, []).append(o.phases["prefill_s"] - price)
    step, per_token = _line(extra)
    return {"kv_send_s": step, "kv_send_per_token_s": per_token}


def _line(extra: dict[int, list[float]]) -> tuple[float, float]:
    """(seconds, seconds per token) through the medians of `extra` (prompt length -> seconds each) at its
    shortest and longest length, neither below 0; (0, 0) with fewer than two lengths."""
    if len(extra) < 2:
        return 0.0, 0.0
    short, long = min(extra), max(extra)
    short_extra, long_extra = statistics.median(extra[short]), statistics.median(extra[long])
    per_token = max(0.0, (long_extra - short_extra) / (long - short))
    step = max(0.0, short_extra - per_token * short)
    if step == 0.0:  # the line crosses 0 above the short probe: through the long one's median from the origin
        per_token = max(0.0, long_extra / long)
    return step, per_token


def _extra_prefill(rounds: list[BesideRound]) -> dict[int, list[float]]:
    """Per probe length, each round's prefill beside the stream less its quiet twin's (pairs with both)."""
    extra: dict[int, list[float]] = {}
    for r in rounds:
        quiet = {o.prompt_len: o.phases["prefill_s"] for o in r.quiet if o.success and o.phases.get("prefill_s")}
        for o in r.beside:
            if o.success and o.phases.get("prefill_s") and o.prompt_len in quiet:
                extra.setdefault(o.prompt_len, []).append(o.phases["prefill_s"] - quiet[o.prompt_len])
    return extra


def beside_prefill_factor(profile: Profile, rounds: list[BesideRound]) -> float | None:
    """The stream's time per token while probes were prefilled over its time alone (the quiet second before
    them), over all rounds: 1 + the difference over the profiled step of its one row, at least 1; None when
    too few of its tokens fell in either (a token's time: the gap that ended with it, counted beside a prefill
    when the whole gap lies inside one)."""
    alone, during = [], []
    for r in rounds:
        tokens = r.stream.token_times()
        windows = [w for w in map(Outcome.prefill_window, r.beside) if w]
        for at, gap in zip(tokens[1:], r.stream.itl):  # (when a token arrived, the gap before it)
            if at <= tokens[0] + r.alone_s:
                alone.append(gap)
            elif any(start <= at - gap and at <= end for start, end in windows):
                during.append(gap)
    if len(alone) < 5 or len(during) < 5:
        return None
    step = profile.step_seconds(StepShape.decode(1, rounds[0].stream.prompt_len + len(alone) // len(rounds)))
    return max(1.0, 1.0 + (statistics.mean(during) - statistics.mean(alone)) / step)


def summary(rounds: list[BesideRound]) -> str:
    """The probes' median prefill beside the stream and quiet, per length, for the profile's note."""
    def median(outcomes: list[Outcome], n: int) -> float:
        return statistics.median([o.phases.get("prefill_s", 0.0) for o in outcomes if o.prompt_len == n] or [0.0])

    beside = [o for r in rounds for o in r.beside]
    quiet = [o for r in rounds for o in r.quiet]
    return ", ".join(f"{n} tokens prefilled in {median(beside, n) * 1e3:.0f} ms beside, {median(quiet, n) * 1e3:.0f} "
                     f"quiet" for n in sorted({o.prompt_len for o in beside}))  # fmt: skip
