"""What the router believes each worker has in its prefix cache: block keys per worker, bounded.

The tree is stored flat. A node is a chain key from `block_keys`, which names
its whole path from the root, so "worker W holds node k" is one set membership
and a prompt's match on W is how many of its leading keys W holds.

Workers evict, so the tree forgets too, in two generations per worker (an
approximate LRU, like a CLOCK). A generation holds `size` blocks: the
worker's KV cache size where it reported one, at most half of
`max_blocks_per_worker`. `insert` adds a prompt's keys to the current
generation; when they would not fit, the current generation becomes the
previous one first and the one before is dropped whole. So each worker is
remembered with at least the last `size` distinct blocks dispatched to it
(all its own cache could hold) and at most twice that: the router errs
towards remembering a prefix a little after the worker evicted it, which
keeps a group on its worker rather than moving it. A prompt's keys always
land in one generation together, so a remembered block's parent is too.

Against an exact LRU (an OrderedDict that deletes a key per key inserted) this
is ~5x cheaper per insert and never rehashes a dict full of deleted slots
(measured pauses of 20 ms at 65,536 blocks); in tests/router's shared-prefix
simulation its hit rates are the same or better.

    worker p0:  previous {k_a1 k_a2 k_b1 ...}   current {k_a1 k_a2 k_a3 k_c1 ...}   len(current) <= size

Ownership: the routing policy that made the tree owns it and calls it from
the router's event loop only (no locks).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence


@dataclass
class _Generations:
    current: dict[int, None] = field(default_factory=dict)  # a dict: insertion-ordered, fast to fill
    previous: dict[int, None] = field(default_factory=dict)

    def __contains__(self, key: int) -> bool:
        return key in self.current or key in self.previous


class PrefixTree:
    def __init__(self, max_blocks_per_worker: int):
        if max_blocks_per_worker < 2:
            raise ValueError(f"max_blocks_per_worker must be at least 2, got {max_blocks_per_worker}")
        self.max_blocks_per_worker = max_blocks_per_worker
        self._workers: dict[str, _Generations] = {}

    def insert(self, worker: str, keys: Sequence[int], cache_blocks: int | None = None) -> None:
        """Record that `worker` now caches the blocks `keys` (a prompt's chain keys, in order).

        `cache_blocks`, the size of the worker's KV cache where known, sizes its generations."""
        generations = self._workers.setdefault(worker, _Generations())
        size = self.max_blocks_per_worker // 2
        if cache_blocks is not None:
            size = max(1, min(size, cache_blocks))
        keys = keys[:size]  # a prompt longer than a generation keeps its shallow blocks: matches start there
        current = generations.current
        if len(current) + sum(1 for key in keys if key not in current) > size:
            generations.previous = current
            current = generations.current = {}
        for key in keys:
            current[key] = None

    def match_length(self, worker: str, keys: Sequence[int]) -> int:
        """How many leading blocks of `keys` `worker` is believed to hold."""
        generations = self._workers.get(worker)
        if generations is None:
            return 0
        return next((i for i, key in enumerate(keys) if key not in generations), len(keys))

    def num_blocks(self, worker: str) -> int:
        """Blocks remembered for `worker` (a block in both generations counts twice)."""
        generations = self._workers.get(worker)
        return len(generations.current) + len(generations.previous) if generations else 0

    def workers(self) -> Iterable[str]:
        return self._workers.keys()

    def forget(self, worker: str) -> None:
        """Drop everything remembered of `worker` (dead, or left the pool)."""
        self._workers.pop(worker, None)
