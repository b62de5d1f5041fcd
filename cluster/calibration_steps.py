"""The serving calibration's loaded phase, step by step: each served engine step (`runtime.step_trace`) against
its profiled price, so that serving's costs are measured where they arise instead of solved from a TPOT.

    steps = loaded_steps(trace_folder, start, end)       # worker -> its steps inside the load's window
    per_round_s = round_gap(steps)                       # the loop's own time between two steps
    factors = step_factors(profile, steps)               # served / profiled: decode rows, prompt tokens,
                                                         # and a time per streamed token

What it found (2026-11-27, Intel Xeon AVX-512, 2 cores, the default one worker of 2 threads under
bench_plan's loads): served steps took 1.10-1.30x their profiled time (the router, the client and Ray share the
cores: a thread of the step preempted holds the others at the next barrier), and 0.6-1.2 ms passed between
two steps. The calibration before it fitted one added time per step to the loaded TPOT (5 ms), which priced
a 50 ms step at +10% and a 140 ms one at +4%: TPOT was under-predicted by 7-24% on the longer steps.

With several workers on the host, a step's factor moves with how much of it the others spent in steps of their
own (`overlap`, from their traces): the fit is the line `alone + (beside - alone) * overlap`, the calibration's
`alone_step_factor` and `step_factor`.

Beside the factors, each fit has a time per token the step samples (`per_streamed_token_s`): the gap between
served and profiled grew with the batch in every calibration of 2026-11-27 18:30 (7 ms at one row, 16 ms at
5-8: the router's and the client's work per streamed token comes out of the steps on a full host), which a
factor fitted to a load of small batches under-priced at larger ones.
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

import numpy as np

from costmodel import Profile, StepShape
from runtime.step_trace import read_step_trace

MAX_ROUND_GAP_S = 0.05  # a longer wait between two steps is the loop idle (no work), not its round
MIN_STEPS = 20  # fewer served steps than this fit nothing (the load was too short)
MIN_STREAMED_COUNTS = 3  # steps that sampled fewer different numbers of tokens: no time per streamed token
MIN_PROMPT_STEPS = 5  # fewer steps with prompt tokens: the idle phase's prefill factor is kept
_SHAPE = tuple(f.name for f in dataclasses.fields(StepShape))  # a trace line's keys that are its step's shape


def loaded_steps(folder: str | Path, start: float, end: float) -> dict[str, list[dict]]:
    """Each worker's trace lines (`runtime.step_trace`) of the steps that began in [start, end] (monotonic)."""
    steps = {}
    for path in sorted(Path(folder).glob("*.jsonl")):
        inside = [s for s in read_step_trace(path) if start <= s["t"] <= end]
        if inside:
            steps[path.stem] = inside
    return steps


def shape(step: dict) -> StepShape:
    return StepShape(**{k: step[k] for k in _SHAPE})


def round_gap(steps: dict[str, list[dict]]) -> float | None:
    """The median time between one step's end and the next one's start on the same worker, counting only the
    loop's rounds while it had work (`MAX_ROUND_GAP_S`); None without two steps in a row."""
    gaps = [b["t"] - (a["t"] + a["s"]) for lines in steps.values() for a, b in zip(lines, lines[1:])]
    gaps = [g for g in gaps if 0 <= g <= MAX_ROUND_GAP_S]
    return statistics.median(gaps) if gaps else None


def overlap(step: dict, others: list[list[dict]]) -> float:
    """The share of `step`'s time the host's other workers spent in steps of their own (0 to 1, their mean)."""
    if not others:
        return 0.0
    begin, end = step["t"], step["t"] + step["s"]
    shares = []
    for lines in others:
        inside = sum(max(0.0, min(end, o["t"] + o["s"]) - max(begin, o["t"])) for o in lines
                     if o["t"] < end and o["t"] + o["s"] > begin)  # fmt: skip
        shares.append(min(1.0, inside / step["s"]) if step["s"] > 0 else 0.0)
    return sum(shares) / len(shares)


def step_factors(profile: Profile, steps: dict[str, list[dict]]) -> dict[str, float] | None:
    """Served over profiled time, fitted to the loaded steps (None: fewer than `MIN_STEPS`).

    One worker: `step_factor` for decode rows and, when enough steps had prompt tokens, `prefill_factor` for
    those: served = profiled * (prompt share * prefill_factor + decode share * step_factor) + streamed tokens *
    per_streamed_token_s.
    Several: decode-only steps against the share of them the other workers stepped too (`overlap`): the line's
    ends are `alone_step_factor` (none of them) and `step_factor` (all), plus the time per streamed token."""
    rows = []  # (profiled seconds, prompt share, overlap, sampled rows, served seconds)
    for name, lines in steps.items():
        others = [v for k, v in steps.items() if k != name]
        for step in lines:
            s = shape(step)
            priced = profile.step_seconds(s)
            if priced > 0:
                prompt_share = step["prompt_tokens"] / max(s.tokens, 1)
                rows.append((priced, prompt_share, overlap(step, others), s.sampled_rows, step["s"]))
    if len(rows) < MIN_STEPS:
        return None
    priced, prompt, shared, streamed, served = (np.array(c, dtype=float) for c in zip(*rows))
    if len(steps) == 1:
        return _lone_factors(priced, prompt, streamed, served)
    decode = prompt == 0
    if decode.sum() < MIN_STEPS:
        return None
    return _line(priced[decode], shared[decode], streamed[decode], served[decode])


def _lone_factors(priced: np.ndarray, prompt: np.ndarray, streamed: np.ndarray, served: np.ndarray) -> dict[str, float]:
    """One worker: each step's served time as its profiled time times the mix of two factors by its prompt share,
    plus a time per streamed token."""
    if (prompt > 0).sum() < MIN_PROMPT_STEPS:
        step, per_token = _weighted_fit([priced], streamed, priced, served)
        return {"step_factor": step, "per_streamed_token_s": per_token}
    decode, prompts, per_token = _weighted_fit([priced * (1.0 - prompt), priced * prompt], streamed, priced, served)
    return {"step_factor": decode, "prefill_factor": prompts, "per_streamed_token_s": per_token}


def _line(priced: np.ndarray, shared: np.ndarray, streamed: np.ndarray, served: np.ndarray) -> dict[str, float]:
    """served = profiled * (alone + (beside - alone) * shared) + streamed tokens * per token. Where the steps'
    overlaps barely spread (the load kept every worker busy, or none beside another), one factor for both."""
    if np.ptp(shared) < 0.5 or min((shared < 0.25).sum(), (shared > 0.75).sum()) < 5:
        pooled, per_token = _weighted_fit([priced], streamed, priced, served)
        return {"alone_step_factor": pooled, "step_factor": pooled, "per_streamed_token_s": per_token}
    alone, slope, per_token = _weighted_fit([priced, priced * shared], streamed, priced, served)
    return {"alone_step_factor": alone, "step_factor": alone + slope, "per_streamed_token_s": per_token}


def _weighted_fit(scaled: list[np.ndarray], streamed: np.ndarray, priced: np.ndarray,
                  served: np.ndarray) -> list[float]:  # fmt: skip
    """Non-negative coefficients of served ~ sum(c_i * scaled_i) + c * streamed, each step's squared error over
    its profiled time: the least squares of its served / profiled ratio weighted by that time (a TPOT is a sum
    of step times, so a long step counts for more). The factors first, the time per streamed token last: 0
    where the steps streamed too few different counts of tokens to tell it from the factors."""
    from scipy.optimize import nnls

    weight = np.sqrt(priced)
    columns = [*scaled, streamed] if len(np.unique(streamed)) >= MIN_STREAMED_COUNTS else scaled
    coef, _ = nnls(np.column_stack(columns) / weight[:, None], served / weight)
    return [float(c) for c in coef] + [0.0] * (len(scaled) + 1 - len(coef))
