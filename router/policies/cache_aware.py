"""cache_aware: send a prompt where its prefix is cached, but never to a worker that is far busier than the rest.

The decision, over the live workers of the pool, with load = `WorkerState.pending`:

1. Busy workers drop out. A worker is busy when, against the least loaded
   worker, its load is more than `balance_abs_threshold` higher AND more than
   `balance_rel_threshold` times as high (SGLang's imbalance test, applied per
   worker). In a pool of two this is "imbalanced: go to the least loaded".
   With more workers, the request still goes to the best prefix match among
   the others: diverting straight to the least loaded worker throws the
   cached prefix away, and under heavy load each such miss adds prefill work
   that makes the next imbalance likelier (tests/router's shared-prefix
   simulation, abs 4, 3x offered load, 24 runs: 89% of the oracle's hit rate
   and a mean time to first token of 1.72 uncached prefills that way, 96%
   and 0.78 this way).
2. If a remaining worker holds at least `cache_threshold` of the prompt's full
   blocks, the longest match wins (the least loaded among equal matches, so a
   hot prefix spreads to a second worker once that one has it too).
3. Otherwise (a new prefix, or too little of one to matter), the worker that
   remembers the fewest blocks, then the least loaded: new prefixes spread
   over the pool's cache room instead of crowding the first worker.

Every choice records the prompt's full blocks for the chosen worker in the
`PrefixTree` (load and cache are both counted at dispatch, not on completion).
The tree remembers, per worker, at least as many recent blocks as the
`total_blocks` the worker last reported, and never more than
`max_blocks_per_worker` (see prefix_tree.py).

Defaults, and why (SGLang's router uses 0.3 / 64 / 1.5 for GPU workers with
queues of hundreds; Tandem's queues are a few requests to tens deep):
- `cache_threshold = 0.3`: SGLang's; a match under 30% of the prompt saves
  too little prefill to outweigh spreading new prefixes (not tuned here: the
  simulation's prompts share a long prefix or nothing).
- `balance_abs_threshold = 8`: in that simulation at 3x offered load, mean
  time to first token (in uncached prefills) for abs 2 / 4 / 8 / 16 / off:
  equally popular system prompts 2.45 / 0.78 / 0.40 / 0.40 / 0.40 (a low
  threshold sends requests to cold workers on queue noise); Zipf(1)
  popularity - / 0.50 / 0.43 / 0.48 / 0.50; Zipf(2), one prompt in half the
  requests, - / 0.30 / 0.34 / 0.46 / 1.77 (affinity alone piles the hot prompt
  onto one worker). 8 is never far from the best.
- `balance_rel_threshold = 1.5`: with the absolute test, only a worker half
  again as busy as the idlest one counts as busy.
- `max_blocks_per_worker = 65536` (a million tokens at block_size 16): the
  bound on the router's memory, a few MB per worker.
- `block_size = 16`: must equal the workers' KV block size, or the keys name
  different blocks than the workers cache.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from router.block_keys import block_keys
from router.prefix_tree import PrefixTree
from router.worker_state import WorkerState


@dataclass(frozen=True)
class CacheAwareConfig:
    block_size: int = 16
    cache_threshold: float = 0.3
    balance_abs_threshold: int = 8
    balance_rel_threshold: float = 1.5
    max_blocks_per_worker: int = 65536

    def __post_init__(self):
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold must be within [0, 1], got {self.cache_threshold}")
        if self.balance_abs_threshold < 0 or self.balance_rel_threshold < 1.0:
            raise ValueError("balance thresholds must be >= 0 (absolute) and >= 1 (relative)")

    def is_busy(self, load: int, least_load: int) -> bool:
        """Whether a worker with `load` is too far above the pool's least loaded one to take affinity traffic."""
        return load - least_load > self.balance_abs_threshold and load > self.balance_rel_threshold * least_load


class CacheAware:
    """Prefix-affinity routing with a load guard; `decisions` counts why each pick went where it did."""

    def __init__(self, config: CacheAwareConfig | None = None, **options):
        self.config = config if config is not None else CacheAwareConfig(**options)
        self.tree = PrefixTree(self.config.max_blocks_per_worker)
        self.decisions: Counter[str] = Counter()  # "cache" / "spread", and "skipped_busy" (some worker left out)

    def pick(self, tokens: Sequence[int], workers: Sequence[WorkerState],
             cache_salt: str | None = None) -> WorkerState:  # fmt: skip
        if not workers:
            raise ValueError("no worker to pick from")
        keys = block_keys(tokens, self.config.block_size, cache_salt)  # a salt's prefixes are its own
        chosen, reason = self._choose(keys, workers)
        self.decisions[reason] += 1
        reported = chosen.load.total_blocks if chosen.load is not None else None
        self.tree.insert(chosen.name, keys, cache_blocks=reported or None)
        return chosen

    def forget(self, worker_name: str) -> None:
        self.tree.forget(worker_name)

    def _choose(self, keys: list[int], workers: Sequence[WorkerState]) -> tuple[WorkerState, str]:
        loads = [w.pending for w in workers]
        least = min(loads)
        candidates = [i for i in range(len(workers)) if not self.config.is_busy(loads[i], least)]
        if len(candidates) < len(workers):
            self.decisions["skipped_busy"] += 1
        matches = {i: self.tree.match_length(workers[i].name, keys) for i in candidates}
        longest = max(matches.values())
        if longest > 0 and longest >= self.config.cache_threshold * len(keys):
            best = min((i for i in candidates if matches[i] == longest), key=lambda i: loads[i])
            return workers[best], "cache"
        best = min(candidates, key=lambda i: (self.tree.num_blocks(workers[i].name), loads[i]))
        return workers[best], "spread"
