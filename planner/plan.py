"""`tandem plan`: simulate every layout within a budget under one workload and pick the one that serves the
most requests within the SLO per device (per dollar when prices are given).

    plan = make_plan(kinds, requests, SLO.parse("ttft_p90=2s,tpot_p90=100ms"), budget=8)
    plan.best            the recommended layout's `Evaluation` (None: no layout meets the SLO)
    plan.evaluations     every layout's, best first

Each layout is simulated (`planner.sim`) on the same requests; its predicted percentiles, throughput and
goodput (`planner.slo`) are read from the same result keys `vllm bench serve` writes. Before searching,
one request alone on the fastest layout tells whether the SLO can be met at all: a bound even an idle
server misses is a ValueError naming it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from planner.layout import EngineLimits, Layout, RouterKnobs
from planner.search import WorkerKind, devices_of, layouts
from planner.sim.run import simulate
from planner.slo import SLO
from planner.workload import SimRequest

REPORTED = ("ttft", "tpot", "itl", "e2el")
PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Evaluation:
    layout: Layout
    devices: int
    price_per_hour: float | None
    result: dict  # vllm bench serve's keys
    misses: tuple[str, ...]  # the SLO bounds it breaks

    @property
    def meets(self) -> bool:
        return not self.misses

    @property
    def goodput(self) -> float:
        return self.result["request_goodput"] or 0.0

    @property
    def goodput_per_device(self) -> float:
        return self.goodput / self.devices

    @property
    def goodput_per_dollar_hour(self) -> float | None:
        """Requests served within the SLO per dollar: goodput (req/s) * 3600 / price per hour."""
        return None if not self.price_per_hour else self.goodput * 3600 / self.price_per_hour


@dataclass(frozen=True)
class Plan:
    slo: SLO
    budget: int
    evaluations: tuple[Evaluation, ...]  # best first: meeting the SLO, then by the objective
    by_price: bool
    wall_s: float
    steps: int = 0
    notes: tuple[str, ...] = field(default=())

    @property
    def best(self) -> Evaluation | None:
        first = self.evaluations[0] if self.evaluations else None
        return first if first is not None and first.meets else None


def evaluate(layout: Layout, kinds: Sequence[WorkerKind], requests: Sequence[SimRequest], slo: SLO,
             max_concurrency: int | None = None) -> tuple[Evaluation, int]:  # fmt: skip
    """The layout's evaluation, and how many steps its simulation took."""
    run = simulate(layout, requests, max_concurrency)
    percentiles = sorted({*PERCENTILES, *slo.percentiles})
    result = run.bench_result(slo.per_request_limits(), REPORTED, percentiles)
    if result["request_goodput"] is None:  # only ITL bounds: every completed request counts
        result["request_goodput"] = result["request_throughput"]
    devices, price = devices_of(layout, kinds)
    misses = list(slo.misses(result))
    if result["failed"]:
        misses.append(f"{result['failed']} of {result['num_prompts']} requests refused or failed")
    return Evaluation(layout, devices, price, result, tuple(misses)), run.steps


def check_feasible(kinds: Sequence[WorkerKind], requests: Sequence[SimRequest], slo: SLO, budget: int,
                   engine: EngineLimits = EngineLimits()) -> None:  # fmt: skip
    """Raise ValueError naming each bound that one request alone misses on every one-worker-per-pool layout
    (nothing else queued: no layout of any size can do better)."""
    longest = max(requests, key=lambda r: (len(r.prompt), r.output_len))
    alone = [SimRequest(0.0, longest.prompt, longest.output_len)]
    best: dict[str, float] = {}
    for layout in layouts(kinds, budget, engine):
        if layout.prefill.replicas > 1 or layout.decode.replicas > 1:
            continue
        result = simulate(layout, alone).bench_result({}, REPORTED, slo.percentiles)
        for b in slo.bounds:
            best[b.key] = min(best.get(b.key, float("inf")), result[b.key])
    impossible = [f"--slo {b.metric}_p{b.percentile:g}={b.limit_ms:g}ms: even alone on an idle server, the longest "
                  f"request's {b.metric} is {best[b.key]:.0f} ms" for b in slo.bounds if best[b.key] > b.limit_ms]  # fmt: skip
    if impossible:
        raise ValueError("; ".join(impossible))


def make_plan(kinds: Sequence[WorkerKind], requests: Sequence[SimRequest], slo: SLO, budget: int,
              max_concurrency: int | None = None, disaggregate: bool = True,
              on_layout: Callable[[Evaluation], None] = lambda e: None, engine: EngineLimits = EngineLimits(),
              router: RouterKnobs = RouterKnobs()) -> Plan:  # fmt: skip
    if not kinds:
        raise ValueError("no worker kind to plan with")
    started = time.perf_counter()
    check_feasible(kinds, requests, slo, budget, engine)
    evaluations, steps = [], 0
    for layout in layouts(kinds, budget, engine, router, disaggregate):
        evaluation, n = evaluate(layout, kinds, requests, slo, max_concurrency)
        evaluations.append(evaluation)
        steps += n
        on_layout(evaluation)
    by_price = all(e.price_per_hour for e in evaluations)
    objective = (lambda e: e.goodput_per_dollar_hour) if by_price else (lambda e: e.goodput_per_device)
    # Meeting the SLO first; then the objective; then more goodput outright; then fewer devices.
    evaluations.sort(key=lambda e: (not e.meets, -objective(e), -e.goodput, e.devices))
    return Plan(slo, budget, tuple(evaluations), by_price, time.perf_counter() - started, steps)
