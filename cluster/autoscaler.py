"""The autoscaler policy: from what the router reports, each pool's next size (pure; the controller acts).

    prefill grows when prompts queue (mean `waiting` per worker above `max_waiting_per_worker`)
            or the mean time to first token since the last look is above `max_latency_s`
    decode  grows when the mean KV usage is above `max_kv_usage`
            or the mean time per output token since the last look is above `max_latency_s`
    a pool shrinks when every one of its signals is below half its target (hysteresis: a
            pool just grown to meet a target does not shrink right back)

One step per pool per look, within [min_replicas, max_replicas], and at most once
per `cooldown_s` per pool (a new worker takes a while to start and to take load; a
pool that just changed is not judged on the numbers from before).
"""

from __future__ import annotations

from dataclasses import dataclass

from cluster.spec import AutoscaleSpec, PoolAutoscale

ROLES = ("prefill", "decode")
LATENCY_OF = {"prefill": "ttft", "decode": "tpot"}


@dataclass(frozen=True)
class PoolSignals:
    workers: int  # live workers with a load report
    waiting: float  # mean prompts queued per worker
    kv_usage: float  # mean fraction of KV blocks in use
    latency_s: float | None  # mean TTFT (prefill) / TPOT (decode) since the last look; None: no request ended


def pool_signals(names: list[str], snapshot: dict, latency_s: float | None) -> PoolSignals:
    """From `Membership.snapshot()` (name -> `MemberView`), over one pool's workers."""
    views = [snapshot[name] for name in names if name in snapshot]
    loads = [view.load for view in views if view.alive and view.load is not None]
    if not loads:
        return PoolSignals(0, 0.0, 0.0, latency_s)
    usage = [1 - load.free_blocks / load.total_blocks if load.total_blocks else 0.0 for load in loads]
    return PoolSignals(len(loads), sum(load.waiting for load in loads) / len(loads), sum(usage) / len(usage), latency_s)


def pressure(role: str, signals: PoolSignals, target: PoolAutoscale) -> float:
    """The largest signal / target ratio of the pool: above 1 it should grow, below 1/2 it may shrink."""
    if role == "prefill":
        ratios = [signals.waiting / target.max_waiting_per_worker]
    else:
        ratios = [signals.kv_usage / target.max_kv_usage]
    if target.max_latency_s is not None and signals.latency_s is not None:
        ratios.append(signals.latency_s / target.max_latency_s)
    return max(ratios)


def next_size(role: str, size: int, signals: PoolSignals, target: PoolAutoscale) -> int:
    """One step toward what the signals ask, within bounds; `size` when they ask nothing."""
    if size == 0 and target.min_replicas == 0:
        return 0  # a pool turned off (colocated: no prefill pool) stays off
    level = pressure(role, signals, target)
    if level > 1 and size < target.max_replicas:
        return size + 1
    if level < 0.5 and size > max(target.min_replicas, 1 if role == "decode" else 0):
        return size - 1
    return size


class Autoscaler:
    """Remembers the cumulative latency counters and when each pool last changed."""

    def __init__(self, spec: AutoscaleSpec):
        self.spec = spec
        self._last_latency: dict[str, tuple[float, float]] = {}
        self._changed_at: dict[str, float] = {}

    def mean_latency(self, name: str, totals: dict[str, tuple[float, float]]) -> float | None:
        """Mean of a latency since the last call, from cumulative (sum, count); None if nothing ended since."""
        total, count = totals.get(name, (0.0, 0.0))
        last_total, last_count = self._last_latency.get(name, (0.0, 0.0))
        self._last_latency[name] = (total, count)
        return (total - last_total) / (count - last_count) if count > last_count else None

    def decide(self, sizes: dict[str, int], members: dict[str, list[str]], snapshot: dict, latency_totals: dict,
               now: float) -> dict[str, int]:  # fmt: skip
        """The pools to resize now ({"decode": 3}); empty when none should change.

        `sizes`: each pool's target size; `members`: each pool's worker names; `latency_totals`:
        the router's cumulative {"ttft": (sum, count), "tpot": (sum, count)}."""
        changes = {}
        for role in ROLES:
            latency = self.mean_latency(LATENCY_OF[role], latency_totals)
            signals = pool_signals(members.get(role, []), snapshot, latency)
            if signals.workers == 0 or now - self._changed_at.get(role, -self.spec.cooldown_s) < self.spec.cooldown_s:
                continue  # nothing reported yet (starting, all dead: the watch's business), or cooling down
            size = next_size(role, sizes[role], signals, self.spec.pool(role))
            if size != sizes[role]:
                changes[role] = size
                self._changed_at[role] = now
        return changes
