"""Conditional disaggregation: when the decode worker prefills a prompt itself instead of a prefill worker.

Disaggregation is worth a short wait (decode steps stay free of long prefills),
not a failed request nor a long queue. The router sends a request with
`GenerateRequest.local_prefill` and no prefill worker when no prefill worker
can take it:
  - none is pickable (none alive: the only one died or restarts; all draining);
  - every pickable one is suspect (a call to it just failed);
  - the least loaded trusted one is far behind the decode worker chosen for the request
    (`LocalPrefillRule.prefill_is_behind`).
A request resumed after its prefill worker died is routed the same way, so
losing the only prefill worker costs clients nothing but some decode speed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from router.registry import WorkerRegistry
from router.worker_state import WorkerState

NO_PREFILL_WORKER, PREFILL_SUSPECT, PREFILL_BACKLOG = "no_prefill_worker", "prefill_suspect", "prefill_backlog"


@dataclass(frozen=True)
class LocalPrefillRule:
    """How far behind the prefill pool must be before decode prefills a prompt itself.

    Both must hold: `backlog_min` requests pending on the least loaded prefill worker, and
    `backlog_ratio` times (the decode worker's pending + 1). Why 8 and 4: a prefill worker batches a
    few prompts per step, so a handful pending is a burst it clears in a step or two, while 8 is
    several steps of waiting (10-30 s each on a CPU). A local prefill is one more prompt in the
    decode worker's batch and slows every sequence it runs, so it must be clearly the shorter way
    for this request: a queue 4x the decode worker's own is. Neither triggers on an idle cluster,
    so the steady state stays disaggregated."""

    backlog_min: int = 8
    backlog_ratio: float = 4.0

    def __post_init__(self):
        if self.backlog_min < 1 or self.backlog_ratio <= 0:
            raise ValueError("backlog_min must be >= 1 and backlog_ratio > 0")

    def prefill_is_behind(self, prefill_pending: int, decode_pending: int) -> bool:
        return prefill_pending >= self.backlog_min and prefill_pending >= self.backlog_ratio * (decode_pending + 1)


def choose_prefill(registry: WorkerRegistry, rule: LocalPrefillRule, tokens: Sequence[int],
                   decode: WorkerState, cache_salt: str | None = None) -> tuple[WorkerState | None, str]:  # fmt: skip
    """The prefill worker for a prompt that goes to `decode`, or (None, why) when decode prefills it itself."""
    if not registry.pickable("prefill"):
        return None, NO_PREFILL_WORKER
    trusted = registry.trusted("prefill")
    if not trusted:
        return None, PREFILL_SUSPECT
    if rule.prefill_is_behind(min(w.pending for w in trusted), decode.pending):
        return None, PREFILL_BACKLOG
    return registry.pick_prefill(tokens, cache_salt), ""
