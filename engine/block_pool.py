"""The pool of fixed-size KV blocks: free list, reference counts, prefix-hash cache.

Ownership: a block with ref_count > 0 belongs to the requests holding it and
is never handed out again. A block whose ref_count drops to 0 goes to the tail
of the free queue but keeps its KV and its hash, so a later request with the
same prefix can take it back (`touch`). `allocate` takes from the head of the
free queue, the least recently freed block first, and only then forgets that
block's hash (LRU eviction of cached blocks no request holds).

    free queue:  head [b7 b2 b9 ... b4] tail
                 evicted first      freed last

Blocks that hold no cached prefix are freed to the head instead: they are
handed out before any cached block is evicted.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from wire.cache_salt import salt_seed

BlockHash = bytes


def chain_root(cache_salt: str | None = None) -> BlockHash:
    """What a prompt's first block chains from: b"root", then the tenant's salt seed (`wire.cache_salt`; empty
    without a salt, so an unsalted chain is unchanged). The one place the engine's hashes take the salt: a
    different root makes the first block's hash differ, and every later one with it."""
    return b"root" + salt_seed(cache_salt)


def hash_block_tokens(parent_hash: BlockHash | None, token_ids) -> BlockHash:
    """Chain hash of a full block: H(parent block's hash, this block's token ids). Never of KV bytes.
    No parent: the unsalted root (`chain_root`)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(parent_hash or chain_root())
    h.update(np.asarray(token_ids, dtype=np.int64).tobytes())
    return h.digest()


def hash_token_blocks(token_ids, block_size: int, start_block: int = 0, parent=None,
                      cache_salt: str | None = None) -> list[BlockHash]:  # fmt: skip
    """Chain hashes of the full blocks of `token_ids` from `start_block` on. `parent`: the hash of the block
    before `start_block`; from the first block, `cache_salt` picks the root (`chain_root`)."""
    if parent is None and start_block == 0:
        parent = chain_root(cache_salt)
    hashes = []
    for b in range(start_block, len(token_ids) // block_size):
        parent = hash_block_tokens(parent, token_ids[b * block_size : (b + 1) * block_size])
        hashes.append(parent)
    return hashes


@dataclass
class KVBlock:
    block_id: int
    ref_count: int = 0
    block_hash: BlockHash | None = None


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool = True):
        if num_blocks < 1:
            raise ValueError(f"a block pool needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self._cached: dict[BlockHash, KVBlock] = {}
        self.num_cache_queries = 0
        self.num_cache_hits = 0

    @property
    def num_free_blocks(self) -> int:
        """Blocks no request holds (some may still hold reusable cached KV)."""
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def lookup(self, block_hash: BlockHash) -> KVBlock | None:
        """The cached block with this chain hash, held or free, or None."""
        return self._cached.get(block_hash) if self.enable_caching else None

    def allocate(self, n: int) -> list[KVBlock]:
        """Take n blocks from the free queue head, evicting their cached hashes. Caller checks capacity."""
        if n > len(self._free):
            raise RuntimeError(f"asked for {n} blocks, only {len(self._free)} free")
        out = []
        for _ in range(n):
            block_id, _ = self._free.popitem(last=False)
            block = self.blocks[block_id]
            self._evict(block)
            block.ref_count = 1
            out.append(block)
        return out

    def touch(self, blocks: list[KVBlock]) -> None:
        """Take one more reference on each block (prefix-cache hits), pulling free ones off the queue."""
        for block in blocks:
            if block.ref_count == 0:
                del self._free[block.block_id]
            block.ref_count += 1

    def free(self, blocks: list[KVBlock]) -> None:
        """Drop one reference per block. Pass blocks in eviction order: the first freed is evicted first.

        A block that holds no cached prefix goes to the head of the queue: it has
        nothing worth keeping, and reusing it first keeps memory that is already
        paged in (and warm in cache) busy instead of touching fresh pages.
        """
        for block in blocks:
            if block.ref_count <= 0:
                raise RuntimeError(f"block {block.block_id} freed more often than allocated")
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block.block_id] = None
                if block.block_hash is None:
                    self._free.move_to_end(block.block_id, last=False)

    def cache_block(self, block: KVBlock, block_hash: BlockHash) -> None:
        """Record that `block` holds the full block with this chain hash (its KV is computed)."""
        if not self.enable_caching or block.block_hash is not None:
            return
        if block_hash in self._cached:
            return  # another block already holds this prefix; keep the first
        block.block_hash = block_hash
        self._cached[block_hash] = block

    def record_query(self, num_queried: int, num_hit: int) -> None:
        self.num_cache_queries += num_queried
        self.num_cache_hits += num_hit

    @property
    def hit_rate(self) -> float:
        return self.num_cache_hits / self.num_cache_queries if self.num_cache_queries else 0.0

    def _evict(self, block: KVBlock) -> None:
        if block.block_hash is not None:
            if self._cached.get(block.block_hash) is block:
                del self._cached[block.block_hash]
            block.block_hash = None
