"""What the router believes each worker has in its prefix cache: block keys, per worker, LRU-capped.

The tree is stored flat. A node is a chain key from `block_keys`, which names
its whole path from the root, so "worker W holds node k" is one set membership
and a prompt's match on W is how many of its leading keys W holds. Each worker
has its own LRU order of keys with a cap, because workers evict too: the tree
is approximate (it learns at dispatch, never from the workers), and the cap
keeps the router's memory bounded whatever the traffic.

Ownership: the routing policy that made the tree owns it and calls it from
the router's event loop only (no locks).

    worker p0: oldest [k_b2 k_a3 k_a2 k_a1 ...] newest    cap: max_blocks
               evicted first

`insert` touches a prompt's keys deepest first, so a prefix is always more
recent than its extensions and a leaf is evicted before its parent.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterable, Sequence


class PrefixTree:
    def __init__(self, max_blocks_per_worker: int):
        if max_blocks_per_worker < 1:
            raise ValueError(f"max_blocks_per_worker must be at least 1, got {max_blocks_per_worker}")
        self.max_blocks_per_worker = max_blocks_per_worker
        self._blocks: dict[str, OrderedDict[int, None]] = {}

    def insert(self, worker: str, keys: Sequence[int], cap: int | None = None) -> None:
        """Record that `worker` now caches the blocks `keys` (a prompt's chain keys, in order).

        `cap` (e.g. the worker's reported KV size) lowers the per-worker cap for this insert.
        """
        blocks = self._blocks.setdefault(worker, OrderedDict())
        for key in reversed(keys):
            if key in blocks:
                blocks.move_to_end(key)
            else:
                blocks[key] = None
        limit = self.max_blocks_per_worker if cap is None else max(1, min(cap, self.max_blocks_per_worker))
        while len(blocks) > limit:
            blocks.popitem(last=False)

    def match_length(self, worker: str, keys: Sequence[int]) -> int:
        """How many leading blocks of `keys` `worker` is believed to hold."""
        blocks = self._blocks.get(worker)
        if not blocks:
            return 0
        matched = 0
        for key in keys:
            if key not in blocks:
                break
            matched += 1
        return matched

    def num_blocks(self, worker: str) -> int:
        blocks = self._blocks.get(worker)
        return len(blocks) if blocks else 0

    def workers(self) -> Iterable[str]:
        return self._blocks.keys()

    def forget(self, worker: str) -> None:
        """Drop everything remembered of `worker` (dead, or left the pool)."""
        self._blocks.pop(worker, None)
