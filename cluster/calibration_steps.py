"""The serving calibration's loaded phase, step by step: each served engine step (`runtime.step_trace`) against
its profiled price, so that serving's costs are measured where they arise instead of solved from a TPOT.

    steps = loaded_steps(trace_folder, start, end)       # worker -> its steps inside the load's window
    per_round_s = round_gap(steps)                       # the loop's own time between two steps, on average
    factors = step_factors(profile, steps)               # served / profiled: decode rows, prompt tokens,
                                                         # and a time per sampled row

What it found (2026-11-27, Intel Xeon AVX-512, 2 cores, the default one worker of 2 threads under
bench_plan's loads): served steps took 1.10-1.30x their profiled time (the router, the client and Ray share the
cores: a thread of the step preempted holds the others at the next barrier), and 0.6-1.2 ms passed between
two steps. The calibration before it fitted one added time per step to the loaded TPOT (5 ms), which priced
a 50 ms step at +10% and a 140 ms one at +4%: TPOT was under-predicted by 7-24% on the longer steps.

With several workers on the host, a step's factor moves with how much of it the others spent in steps of their
own (`overlap`, from their traces): the fit is the line `alone + (beside - alone) * overlap`, the calibration's
`alone_step_factor` and `step_factor`.

Beside the factors, each fit has a time per row the step samples (`per_served_row_s`), of either sign: the gap
between served and profiled grew with the batch in every calibration of 2026-11-27 18:30 (7 ms at one row, 16
ms at 5-8: the router's and the client's work per streamed token comes out of the steps on a full host), and
on 2026-11-28 02:15 a profile priced 17-24-row steps 18% above their served time while pricing one row at it:
a factor follows neither. The load ends in a burst (`cluster.serving_calibration`) so that the fit sees the
batches of up to 16 rows a worker that the Poisson arrivals (1-4 rows) never step. Bounded below by minus the
profile's own price of a decode row, so that no row is priced below nothing.
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
MIN_ROW_COUNTS = 3  # steps that sampled fewer different numbers of rows: no time per sampled row
STALL_RATIO = 1.8  # a served step this many times its fitted time was stalled by the VM: left out of the fit
MIN_PROMPT_STEPS = 5  # fewer steps with prompt tokens: the idle phase's prefill factor is kept


def loaded_steps(folder: str | Path, start: float, end: float) -> dict[str, list[dict]]:
    """Each worker's trace lines (`runtime.step_trace`) of the steps that began in [start, end] (monotonic)."""
    steps = {}
    for path in sorted(Path(folder).glob("*.jsonl")):
        inside = [s for s in read_step_trace(path) if start <= s["t"] <= end]
        if inside:
            steps[path.stem] = inside
    return steps


def shape(step: dict) -> StepShape:
    return StepShape.from_record(step)


def round_gap(steps: dict[str, list[dict]]) -> float | None:
    """The mean time between one step's end and the next one's start on the same worker, counting only the
    loop's rounds while it had work (`MAX_ROUND_GAP_S`); None without two steps in a row."""
    gaps = [b["t"] - (a["t"] + a["s"]) for lines in steps.values() for a, b in zip(lines, lines[1:])]
    gaps = [g for g in gaps if 0 <= g <= MAX_ROUND_GAP_S]
    return statistics.mean(gaps) if gaps else None


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
    those: served = profiled * (prompt share * prefill_factor + decode share * step_factor) + sampled rows *
    per_served_row_s.
    Several: decode-only steps against the share of them the other workers stepped too (`overlap`): the line's
    ends are `alone_step_factor` (none of them) and `step_factor` (all), plus the time per sampled row."""
    fit = _Fit(row_price(profile))
    points = []  # (profiled seconds, prompt share, overlap, sampled rows, served seconds)
    for name, lines in steps.items():
        others = [v for k, v in steps.items() if k != name]
        for step in lines:
            s = shape(step)
            priced = profile.step_seconds(s)
            if priced > 0:
                prompt_share = step["prompt_tokens"] / max(s.tokens, 1)
                points.append((priced, prompt_share, overlap(step, others), s.sampled_rows, step["s"]))
    if len(points) < MIN_STEPS:
        return None
    priced, prompt, shared, sampled, served = (np.array(c, dtype=float) for c in zip(*points))
    if len(steps) == 1:
        return fit.lone(priced, prompt, sampled, served)
    decode = prompt == 0
    if decode.sum() < MIN_STEPS:
        return None
    return fit.line(priced[decode], shared[decode], sampled[decode], served[decode])


def row_price(profile: Profile) -> float:
    """The profile's price of a second decode row beside one (>= 0): the most a time per sampled row may take off.
    The steps' kernel bands are left out: a band's seconds go with the step's token count, not with a row, and
    where the profile prices the 1-row band above the 2-4-row one (Intel Xeon, bfloat16, 2 threads, 2026-12-07:
    13.3 against 9.8 ms, 1- and 2-row steps both measured at 13-16 ms) the two steps' difference was negative:
    the fit's start (no time per row) fell outside its bounds and the serving calibration failed."""
    one, two = (profile.step.terms(StepShape.decode(rows, 0)) for rows in (1, 2))
    return max(0.0, sum(two[term] - one[term] for term in one if term != "kernel_band"))


@dataclasses.dataclass(frozen=True)
class _Fit:
    """The fits of served steps against their profiled prices; `row_price_s`: the profile's price of one more
    decode row, the most a time per sampled row may take off."""

    row_price_s: float

    def lone(self, priced: np.ndarray, prompt: np.ndarray, rows: np.ndarray, served: np.ndarray) -> dict[str, float]:
        """One worker: each step's served time as its profiled time times the mix of two factors by its prompt
        share, plus a time per sampled row."""
        if (prompt > 0).sum() < MIN_PROMPT_STEPS:
            step, per_row = self.weighted([priced], rows, priced, served)
            return {"step_factor": step, "per_served_row_s": per_row}
        decode, prompts, per_row = self.weighted([priced * (1.0 - prompt), priced * prompt], rows, priced, served)
        return {"step_factor": decode, "prefill_factor": prompts, "per_served_row_s": per_row}

    def line(self, priced: np.ndarray, shared: np.ndarray, rows: np.ndarray, served: np.ndarray) -> dict[str, float]:
        """served = profiled * (alone + (beside - alone) * shared) + sampled rows * per row. Where the steps'
        overlaps barely spread (the load kept every worker busy, or none beside another), one factor for both."""
        if np.ptp(shared) < 0.5 or min((shared < 0.25).sum(), (shared > 0.75).sum()) < 5:
            pooled, per_row = self.weighted([priced], rows, priced, served)
            return {"alone_step_factor": pooled, "step_factor": pooled, "per_served_row_s": per_row}
        alone, slope, per_row = self.weighted([priced, priced * shared], rows, priced, served)
        return {"alone_step_factor": alone, "step_factor": alone + slope, "per_served_row_s": per_row}

    def weighted(self, scaled: list[np.ndarray], rows: np.ndarray, priced: np.ndarray,
                 served: np.ndarray) -> list[float]:  # fmt: skip
        """Coefficients of served ~ sum(c_i * scaled_i) + c * rows, each step's squared error over its profiled
        time: the least squares of its served / profiled ratio weighted by that time (a TPOT is a sum of step
        times, so a long step counts for more). The factors first (>= 0), the time per row last (>= minus the
        row's price): 0 where the steps sampled too few different counts of rows to tell it from the factors.

        Steps served at more than `STALL_RATIO` times a first, robust fit are left out: a few steps the VM
        stalled for a second (384-token prompts served in 1.0-1.5 s where their neighbours took 0.5, 2026-11-28
        03:12) pulled every factor of a load up by half, and no served step of the runs it priced was slowed so."""
        from scipy.optimize import least_squares, lsq_linear

        with_rows = len(np.unique(rows)) >= MIN_ROW_COUNTS
        design = np.column_stack([*scaled, rows] if with_rows else scaled)
        bounds = ([0.0] * len(scaled) + ([-self.row_price_s] if with_rows else []), np.inf)
        weight = np.sqrt(priced)
        start = np.array([1.0] * len(scaled) + ([0.0] if with_rows else []))
        # The same weighted residuals, scaled so that 0.1 is an error of a tenth of a step of the mean price.
        scale = 1.0 / np.sqrt(priced.mean())
        robust = least_squares(lambda c: (design @ c - served) / weight * scale, start, bounds=bounds,
                               loss="soft_l1", f_scale=0.1).x  # fmt: skip
        kept = served <= STALL_RATIO * np.maximum(design @ robust, 1e-9)
        coef = lsq_linear(design[kept] / weight[kept, None], served[kept] / weight[kept], bounds=bounds).x
        return [float(c) for c in coef] + [0.0] * (len(scaled) + 1 - len(coef))
