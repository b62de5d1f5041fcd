"""Run one layout against one workload on simulated time, and reckon the outcome as `vllm bench serve` would.

    result = simulate(layout, WorkloadSpec(...).requests(vocab), max_concurrency=None)
    result.bench_result(slos={"tpot": 60}, percentiles=[50, 90, 99])   # its result JSON's keys

The client is `vllm bench serve`'s: each request is sent at its arrival time, or (`max_concurrency`)
once one of that many slots is free; the run lasts until the last request ends.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Sequence

from planner.bench_metrics import METRICS, compute_metrics
from planner.layout import Layout
from planner.sim.events import EventQueue
from planner.sim.router import ClientRequest, SimRouter
from planner.sim.worker import COLOCATED_THRESHOLD, SimWorker
from planner.workload import SimRequest


@dataclass(frozen=True)
class SimResult:
    layout: Layout
    requests: tuple[ClientRequest, ...]
    duration_s: float  # simulated: from the first arrival to the last request's end
    steps: int  # engine steps simulated, every worker
    events: int
    wall_s: float  # how long the simulation itself took

    def bench_result(self, slos: dict[str, float] | None = None, metrics: Sequence[str] = ("ttft", "tpot", "itl"),
                     percentiles: Sequence[float] = (99,)) -> dict:  # fmt: skip
        """The keys `vllm bench serve --save-result` writes (counts, throughputs, goodput, each metric's mean,
        median, std and percentiles in ms), plus `input_lens` / `output_lens` / `errors` per request."""
        unknown = set(metrics) - set(METRICS)
        if unknown:
            raise ValueError(f"--percentile-metrics: unknown {', '.join(sorted(unknown))} (choose from {', '.join(METRICS)})")
        outs = list(self.requests)
        result = compute_metrics(outs, [o.output_tokens for o in outs], max(self.duration_s, 1e-9), 0.0, slos or {},
                                 list(metrics), list(percentiles))  # fmt: skip
        result.update(num_prompts=len(outs), input_lens=[o.prompt_len for o in outs],
                      output_lens=[o.output_tokens for o in outs], errors=[o.error for o in outs])  # fmt: skip
        return result


class _Client:
    """`vllm bench serve`'s sending side: arrivals, and at most `max_concurrency` requests out at once."""

    def __init__(self, events: EventQueue, router: SimRouter, requests: Sequence[SimRequest],
                 max_concurrency: int | None):  # fmt: skip
        self.events, self.router = events, router
        self.slots = max_concurrency or len(requests)
        self.total = len(requests)
        self.requests: list[ClientRequest] = []  # in order of arrival, each made when it arrives
        self.queued: deque[ClientRequest] = deque()
        self.out = self.ended = 0
        self.last_end = 0.0
        for request in requests:
            events.at(request.arrival_s, self._arrived, request)

    def _arrived(self, request: SimRequest) -> None:
        # The prompt is made now (a trace's lazily): only the requests under way hold theirs.
        client = ClientRequest(request.prompt, request.output_len, request.arrival_s, on_end=self._ended)
        self.requests.append(client)
        self.queued.append(client)
        self._send()

    def _send(self) -> None:
        while self.queued and self.out < self.slots:
            request = self.queued.popleft()
            request.start_time = self.events.now
            self.out += 1
            self.router.submit(request)

    def _ended(self, request: ClientRequest) -> None:
        self.out -= 1
        self.ended += 1
        self.last_end = self.events.now
        if self.ended == self.total:
            self.events.stop()
        else:
            self._send()


def build_workers(layout: Layout, events: EventQueue) -> list[SimWorker]:
    """The layout's workers, all on one host: the layouts simulated from this machine's measured profiles
    share its cores (published profiles have no host factors: `ServingCost.factor_at`)."""
    workers = [SimWorker(f"prefill-{i}", "prefill", layout.prefill.profile, layout.engine, events,
                         layout.arrival_window) for i in range(layout.prefill.replicas)]  # fmt: skip
    threshold = COLOCATED_THRESHOLD if layout.colocated else 0
    workers += [SimWorker(f"decode-{i}", "decode", layout.decode.profile, layout.engine, events, layout.arrival_window,
                          threshold) for i in range(layout.decode.replicas)]  # fmt: skip
    for worker in workers:
        worker.host = workers
    return workers


def simulate(layout: Layout, requests: Sequence[SimRequest], max_concurrency: int | None = None) -> SimResult:
    if not requests:
        raise ValueError("a simulation needs at least one request")
    started = time.perf_counter()
    events = EventQueue()
    workers = build_workers(layout, events)
    router = SimRouter(events, workers, layout.router, layout.engine.block_size, layout.colocated)
    router.start_polling()
    client = _Client(events, router, sorted(requests, key=lambda r: r.arrival_s), max_concurrency)
    events.run()
    if client.ended < client.total:
        raise RuntimeError(f"the simulation stalled with {client.total - client.ended} requests unfinished")
    steps = sum(w.engine.runner.steps for w in workers)
    return SimResult(layout, tuple(client.requests), client.last_end, steps, events.events,
                     time.perf_counter() - started)  # fmt: skip
