"""A shared-prefix workload routed over simulated prefill workers that keep a real prefix cache.

Workload: `num_groups` long system prompts, each followed by many short user
turns; all prompts interleaved in one seeded random order, arriving at a
steady rate.

Each simulated prefill worker serves its queue one request at a time. At
admission it looks the prompt's chain hashes up in an engine `BlockPool` (the
worker's real prefix cache, `capacity` blocks, LRU over blocks no request
holds): the leading hashes it finds are the prompt's hits, the rest it
allocates and caches. The request then takes time in proportion to its
uncached tokens, and frees its blocks when done. The router's view is a
`WorkerState` per worker: `in_flight` counted at dispatch, down at finish, and
a `WorkerLoad` report refreshed at every event.
"""

from __future__ import annotations

import functools
import random
from collections import deque
from dataclasses import dataclass, field

from engine.block_pool import BlockPool, hash_token_blocks
from wire.requests import WorkerLoad
from router.worker_state import WorkerState


@dataclass(frozen=True)
class Workload:
    num_groups: int = 12
    prompts_per_group: int = 40
    system_tokens: int = 512
    user_tokens: tuple[int, int] = (16, 160)  # uniform range of a user turn's length
    block_size: int = 16
    vocab: int = 32000
    popularity_skew: float = 0.0  # 0: groups equally popular; s: group g's share goes as 1 / (g + 1)**s
    seed: int = 0

    def group_sizes(self) -> list[int]:
        weights = [1 / (g + 1) ** self.popularity_skew for g in range(self.num_groups)]
        total = self.num_groups * self.prompts_per_group
        return [max(1, round(total * w / sum(weights))) for w in weights]

    def prompts(self) -> list[tuple[int, list[int]]]:
        """(group, token ids) in arrival order."""
        rng = random.Random(self.seed)
        systems = [[rng.randrange(self.vocab) for _ in range(self.system_tokens)] for _ in range(self.num_groups)]
        prompts = [
            (group, systems[group] + [rng.randrange(self.vocab) for _ in range(rng.randint(*self.user_tokens))])
            for group, size in enumerate(self.group_sizes())
            for _ in range(size)
        ]
        rng.shuffle(prompts)
        return prompts


@dataclass
class Request:
    tokens: list[int]
    hashes: list[bytes]


@functools.lru_cache(maxsize=8)
def arrivals(workload: Workload) -> list[tuple[int, Request]]:
    """The workload's (group, request) in arrival order, hashed once for every policy simulated on it."""
    return [
        (group, Request(tokens, hash_token_blocks(tokens, workload.block_size))) for group, tokens in workload.prompts()
    ]


@dataclass
class SimWorker:
    state: WorkerState
    pool: BlockPool
    block_size: int
    tokens_per_second: float
    queue: deque = field(default_factory=deque)
    running: tuple[list, float] | None = None  # the running request's blocks, its finish time
    dispatched: int = 0
    hit_blocks: int = 0
    queried_blocks: int = 0
    total_latency: float = 0.0  # arrival to end of prefill, summed over finished requests

    def submit(self, request: Request, now: float) -> None:
        self.state.in_flight += 1
        self.dispatched += 1
        self.queue.append((request, now))
        self.advance(now)

    def advance(self, now: float) -> None:
        """Run the worker up to time `now`: finish what is due, admit the next queued request."""
        clock = now
        while True:
            if self.running is not None:
                blocks, finish = self.running
                if finish > now:
                    break
                self.pool.free(list(reversed(blocks)))  # deepest first: leaves are evicted before prefixes
                self.state.in_flight -= 1
                self.running, clock = None, finish
            if not self.queue:
                break
            self._admit(*self.queue.popleft(), clock)
        self._report()

    def _admit(self, request: Request, arrival: float, start: float) -> None:
        cached = []
        for block_hash in request.hashes:
            block = self.pool.lookup(block_hash)
            if block is None:
                break
            cached.append(block)
        self.pool.touch(cached)
        num_blocks = -(-len(request.tokens) // self.block_size)
        fresh = self.pool.allocate(num_blocks - len(cached))
        for block, block_hash in zip(fresh, request.hashes[len(cached) :]):
            self.pool.cache_block(block, block_hash)
        uncached = len(request.tokens) - len(cached) * self.block_size
        self.hit_blocks += len(cached)
        self.queried_blocks += len(request.hashes)
        finish = start + uncached / self.tokens_per_second
        self.total_latency += finish - arrival
        self.running = (cached + fresh, finish)

    def _report(self) -> None:
        self.state.load = WorkerLoad(
            name=self.state.name,
            waiting=len(self.queue),
            running=int(self.running is not None),
            transferring=0,
            free_blocks=self.pool.num_free_blocks,
            total_blocks=self.pool.num_blocks,
            prefix_cache_hit_rate=self.pool.hit_rate,
        )


@dataclass(frozen=True)
class Outcome:
    hit_rate: float  # prompt blocks found cached / prompt full blocks
    dispatched: list[int]  # requests per worker
    mean_latency: float  # arrival to end of prefill (time to first token), in units of one uncached prompt

    @property
    def load_ratio(self) -> float:
        """Busiest worker's dispatched requests over the mean."""
        return max(self.dispatched) / (sum(self.dispatched) / len(self.dispatched))


def simulate(workload: Workload, route, num_workers: int, capacity_blocks: int, utilization: float = 0.8) -> Outcome:
    """Route every prompt with `route(group, tokens, worker_states) -> WorkerState`.

    Arrivals are spaced so the pool would run at `utilization` if no prompt hit the cache.
    """
    tokens_per_second = 10_000.0
    workers = [
        SimWorker(WorkerState(f"p{i}", "prefill"), BlockPool(capacity_blocks), workload.block_size, tokens_per_second)
        for i in range(num_workers)
    ]
    by_name = {w.state.name: w for w in workers}
    requests = arrivals(workload)
    mean_tokens = sum(len(request.tokens) for _, request in requests) / len(requests)
    interval = mean_tokens / (tokens_per_second * num_workers * utilization)
    states = [w.state for w in workers]
    for i, (group, request) in enumerate(requests):
        now = i * interval
        for worker in workers:
            worker.advance(now)
        chosen = route(group, request.tokens, states)
        by_name[chosen.name].submit(request, now)
    for worker in workers:
        worker.advance(float("inf"))
    return Outcome(
        hit_rate=sum(w.hit_blocks for w in workers) / sum(w.queried_blocks for w in workers),
        dispatched=[w.dispatched for w in workers],
        mean_latency=sum(w.total_latency for w in workers) / len(requests) / (mean_tokens / tokens_per_second),
    )
