"""The layouts a plan weighs: every colocated and disaggregated arrangement of the worker kinds at hand
within a budget of devices.

A *worker kind* is one worker as a pool would start it, with its profile and what it occupies: a GPU
worker of tensor-parallel size t takes t GPUs; a CPU worker of t threads takes t cores. Layouts:

  colocated        n workers of one kind, each prefilling its own prompts      n * devices <= budget
  disaggregated    p prefill workers of one kind + d decode workers of a kind   p * devices_p + d * devices_d
                   (the same kind, or another: prefill on one device type,      <= budget
                   decode on another)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterator, Sequence

from costmodel import Profile
from planner.layout import EngineLimits, Layout, PoolLayout, RouterKnobs


@dataclass(frozen=True)
class WorkerKind:
    profile: Profile
    devices: int  # GPUs (its tensor-parallel size) or CPU cores (its threads) one worker takes
    unit: str  # "GPU" or "core"

    @property
    def name(self) -> str:
        p = self.profile
        if self.unit == "core":
            return f"{p.device.split(' [')[0]} x{self.devices} thread(s)"
        return f"{p.device} tp{p.tp_size}"

    @property
    def price_per_hour(self) -> float | None:
        return self.profile.price_per_hour


def layouts(kinds: Sequence[WorkerKind], budget: int, engine: EngineLimits = EngineLimits(),
            router: RouterKnobs = RouterKnobs(), disaggregate: bool = True) -> Iterator[Layout]:  # fmt: skip
    """Every layout of `kinds` within `budget` devices: the colocated ones first."""
    if budget < 1:
        raise ValueError(f"--max-devices must be >= 1, got {budget}")
    for kind in kinds:
        for n in range(1, budget // kind.devices + 1):
            yield Layout(PoolLayout(0, None), PoolLayout(n, kind.profile), engine, router)
    if not disaggregate:
        return
    for pk in kinds:
        for dk in kinds:
            if pk.profile.model != dk.profile.model:
                continue
            for p in range(1, budget // pk.devices + 1):
                for d in range(1, (budget - p * pk.devices) // dk.devices + 1):
                    yield Layout(PoolLayout(p, pk.profile), PoolLayout(d, dk.profile), engine, router)


def devices_of(layout: Layout, kinds: Sequence[WorkerKind]) -> tuple[int, float | None]:
    """(devices the layout occupies, its price per hour or None when a kind has no price)."""
    by_profile = {id(k.profile): k for k in kinds}
    devices, price = 0, 0.0
    for pool in (layout.prefill, layout.decode):
        if not pool.replicas:
            continue
        kind = by_profile[id(pool.profile)]
        devices += pool.replicas * kind.devices
        price = None if price is None or kind.price_per_hour is None else price + pool.replicas * kind.price_per_hour
    return devices, price


def with_rate(layout: Layout, **router) -> Layout:
    return replace(layout, router=replace(layout.router, **router))
