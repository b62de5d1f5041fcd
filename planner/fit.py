"""Fit a `costmodel.StepCost` to measured steps and say how well it fits.

Relative errors are minimised (a 20 ms decode step matters as much as a 2 s prefill), with a soft-L1
loss so that the few steps a shared machine slowed down do not pull the terms; every term is >= 0.
`per_token_comm_s` is not fitted: a measured profile at tensor parallel size n carries its all-reduces
in the other terms.

With the engine's kernel bands (`band_firsts`, `engine.layers.linear_choice.BANDS`' first row counts), each
band some step fell in gets a term of its own, the seconds its kernels add to a step; a band no step fell in
is priced as the band below it. The bands and `fixed_s` overlap (every step is in one band), so the cheapest
band is set to 0 and its seconds go to `fixed_s`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy.optimize import least_squares

from costmodel import FitReport, StepCost, StepShape
from costmodel.step_cost import SMALL_STEP_TOKENS, band_index

FITTED = ("fixed_s", "weights_s", "per_token_s", "per_sampled_row_s", "per_sequence_s",
          "per_decode_context_token_s", "per_attention_pair_s", "per_prefill_context_token_s",
          "per_longest_decode_context_s", "per_prefix_attention_pair_s", "per_small_step_token_s")  # fmt: skip


@dataclass(frozen=True)
class StepSample:
    shape: StepShape
    seconds: float
    chunks: tuple[tuple[int, int], ...] = ()  # its prefill chunks, (new, context) each (`runtime.step_shapes`)


def fit_step_cost(samples: Sequence[StepSample], band_firsts: Sequence[int] = ()) -> tuple[StepCost, FitReport]:
    """The terms that best reproduce `samples`, with a term per kernel band of `band_firsts` (ascending first
    token counts; empty: none) that a sample fell in."""
    bands = sampled_bands(band_firsts, [s.shape.tokens for s in samples])
    if len(samples) < len(FITTED) + len(bands):
        raise ValueError(f"a fit of {len(FITTED) + len(bands)} terms needs at least as many measured steps, "
                         f"got {len(samples)}")  # fmt: skip
    x = np.column_stack([_features(samples), _band_indicators(bands, samples)])
    t = np.array([s.seconds for s in samples])

    def solve(start: np.ndarray, loss: str, columns: int = x.shape[1]) -> np.ndarray:
        used = x[:, :columns]
        return least_squares(lambda p: (_predict(p, used) - t) / t, start, bounds=(0, np.inf),
                             x_scale=np.maximum(start, 1e-9), loss=loss, f_scale=0.05).x  # fmt: skip

    # Plain least squares first, from the additive guess, then the robust loss from there: started far from
    # the answer, a robust loss can take the largest steps for outliers and settle on the small ones. The
    # linear layers' max() has local minima the band terms deepen: the fit without bands is a start too.
    starts = [_first_guess(x, t)]
    if bands:
        smooth = solve(_first_guess(x[:, :FEATURES], t), "linear", FEATURES)
        starts.append(np.concatenate([smooth, np.full(len(bands), 1e-6)]))
    candidates = []
    for start in starts:
        plain = solve(start, "linear")
        candidates += [plain, solve(plain, "soft_l1")]
    best = min(candidates, key=lambda p: float(np.median(np.abs(_predict(p, x) - t) / t)))
    terms = dict(zip(FITTED, (float(v) for v in best)))
    offsets = [float(v) for v in best[len(FITTED):]]
    if offsets:  # the cheapest band at 0, its seconds in the fixed term (the two overlap)
        terms["fixed_s"] += min(offsets)
        terms["kernel_bands"] = tuple((first, v - min(offsets)) for first, v in zip(bands, offsets))
    cost = StepCost(**terms)
    return cost, report(cost, samples)


def sampled_bands(band_firsts: Sequence[int], tokens: Sequence[int]) -> tuple[int, ...]:
    """The firsts of the bands some step of `tokens` tokens fell in; the lowest of them starts at the first
    band's first, so that a band below every sampled one is priced as the lowest sampled."""
    kept = [band_firsts[i] for i in sorted({band_index(band_firsts, n) for n in tokens} - {-1})]
    return tuple(band_firsts[:1]) + tuple(kept[1:]) if kept else ()


def _band_indicators(bands: Sequence[int], samples: Sequence[StepSample]) -> np.ndarray:
    """[n, len(bands)]: 1 where a sample falls in the band (the last band starting at or below its tokens)."""
    out = np.zeros((len(samples), len(bands)))
    for i, s in enumerate(samples):
        j = band_index(bands, s.shape.tokens)
        if j >= 0:
            out[i, j] = 1.0
    return out


def report(cost: StepCost, samples: Sequence[StepSample], worst: int = 5) -> FitReport:
    predicted = np.array([cost.seconds(s.shape) for s in samples])
    measured = np.array([s.seconds for s in samples])
    errors = np.abs(predicted - measured) / measured
    order = np.argsort(-errors)[:worst]
    return FitReport(
        points=len(samples),
        median_abs_error=float(np.median(errors)),
        p90_abs_error=float(np.percentile(errors, 90)),
        max_abs_error=float(errors.max()),
        worst=tuple((describe(samples[i].shape), float(measured[i]), float(predicted[i])) for i in order),
    )


def describe(shape: StepShape) -> str:
    return (f"{shape.tokens} tokens, {shape.sequences} seqs, {shape.sampled_rows} sampled, "
            f"{shape.decode_context_tokens} decode ctx, {shape.prefill_attention_pairs:.0f} pairs")  # fmt: skip


FEATURES = 9  # the columns of `_features`, before the band indicators


def _features(samples: Sequence[StepSample]) -> np.ndarray:
    """[n, 9]: tokens, sampled rows, sequences, decode context tokens, prefill attention pairs, prefill context,
    longest decode context, prefix attention pairs, small-step tokens."""
    return np.array([(s.shape.tokens, s.shape.sampled_rows, s.shape.sequences, s.shape.decode_context_tokens,
                      s.shape.prefill_attention_pairs, s.shape.prefill_context_tokens, s.shape.longest_decode_context,
                      s.shape.prefix_attention_pairs, min(s.shape.tokens, SMALL_STEP_TOKENS))
                     for s in samples], dtype=float)  # fmt: skip


def _predict(p: np.ndarray, x: np.ndarray) -> np.ndarray:
    """`StepCost.seconds` over the rows of `_features` and the band indicators after them, the terms in
    `FITTED`'s order and then each band's."""
    (fixed, weights, per_token, per_row, per_seq, per_ctx, per_pair, per_prefill_ctx, per_longest, per_prefix_pair,
     per_small) = p[:len(FITTED)]
    linear = np.maximum(weights, per_token * x[:, 0] + per_small * x[:, 8])
    return (fixed + linear + per_row * x[:, 1] + per_seq * x[:, 2] + per_ctx * x[:, 3] + per_pair * x[:, 4]
            + per_prefill_ctx * x[:, 5] + per_longest * x[:, 6] + per_prefix_pair * x[:, 7]
            + x[:, 9:] @ p[len(FITTED):])  # fmt: skip


def _first_guess(x: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Non-negative least squares of the additive form (linear layers as weights + per token): close enough
    to start from, and a sensible answer on its own if the data cannot tell memory from compute."""
    from scipy.optimize import nnls

    design = np.column_stack([np.ones(len(t)), x]) / t[:, None]  # relative error
    coef, _ = nnls(design, np.ones(len(t)))
    fixed, *rest = coef
    per_token = rest[0]
    return np.array([fixed / 2, max(fixed / 2, 1e-6), per_token, *rest[1:]]) + 1e-12
