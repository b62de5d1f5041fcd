"""How long a dead worker waits before its next restart: none after a stable life, doubling in a crash loop.

A worker whose engine cannot start (bad node, out of memory, a broken model file)
dies again right after each restart; restarting it at once would spin the
controller and flood the log. So a worker that dies within `stable_after_s` of
its start adds one to its streak of quick deaths, and waits
`restart_backoff_s * 2 ** (streak - 1)` (at most `restart_backoff_max_s`);
one that lived longer starts a new streak and is restarted at once.
"""

from __future__ import annotations

from cluster.spec import HealthSpec


def next_streak(streak: int, lived_s: float, health: HealthSpec) -> int:
    """The streak of quick deaths after one more death of a worker that lived `lived_s`."""
    return streak + 1 if lived_s < health.stable_after_s else 0


def restart_delay(streak: int, health: HealthSpec) -> float:
    """Seconds to wait before restarting a worker with this streak of quick deaths."""
    if streak <= 0:
        return 0.0
    doublings = min(streak - 1, 64)  # a long crash loop must not overflow the float
    return min(health.restart_backoff_s * 2.0**doublings, health.restart_backoff_max_s)
