"""Per-request block bookkeeping on top of the BlockPool.

Ownership: a request holds one reference on each block in `request.blocks`
from `allocate_slots` until `free(request)`; the scheduler calls `free` the
moment a request finishes, is aborted or is preempted. Blocks are cached
(hash recorded) only once every token in them has its KV computed.
"""

from __future__ import annotations

from engine.block_pool import BlockPool, KVBlock, hash_token_blocks
from engine.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks, enable_caching=enable_prefix_caching)

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        return 1.0 - self.pool.num_free_blocks / self.pool.num_blocks

    def find_cached_prefix(self, request: Request) -> list[KVBlock]:
        """Longest run of cached full blocks that starts the request's tokens.

        At least one token is always left to compute, so the step that finishes
        the prompt produces logits to sample from. A request that asks for its prompt's
        logprobs gets no hits: every prompt token is computed (as vLLM does).
        """
        if not self.enable_prefix_caching or request.params.prompt_logprobs is not None:
            return []
        self._extend_hashes(request)
        max_blocks = (request.num_tokens - 1) // self.block_size
        hits = []
        for block_hash in request.block_hashes[:max_blocks]:
            block = self.pool.lookup(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits

    def allocate_slots(self, request: Request, num_new_tokens: int, cached: list[KVBlock] = ()) -> bool:
        """Make room for `num_new_tokens` beyond the computed (and `cached`) tokens.

        `cached` are prefix hits for a request that holds no blocks yet; on
        success the request references them. Returns False, changing nothing,
        when the pool cannot supply the blocks.
        """
        num_computed = request.num_computed_tokens + len(cached) * self.block_size
        needed = cdiv(num_computed + num_new_tokens, self.block_size) - len(request.blocks) - len(cached)
        # Free cached hits are counted in num_free_blocks but would be consumed by touch().
        num_free_hits = sum(1 for b in cached if b.ref_count == 0)
        if needed > self.pool.num_free_blocks - num_free_hits:
            return False
        if cached:
            self.pool.touch(list(cached))
            request.blocks.extend(cached)
        if needed > 0:
            request.blocks.extend(self.pool.allocate(needed))
        return True

    def cache_computed_blocks(self, request: Request) -> None:
        """Record hashes of the request's blocks that are now full and computed (only those not offered before:
        going over every block at each step made a long context's decode step quadratic in its length)."""
        if not self.enable_prefix_caching:
            return
        num_full = min(request.num_computed_tokens // self.block_size, len(request.blocks))
        if num_full <= request.num_offered_blocks:
            return
        self._extend_hashes(request)
        for i in range(request.num_offered_blocks, num_full):
            self.pool.cache_block(request.blocks[i], request.block_hashes[i])
        request.num_offered_blocks = num_full

    def free(self, request: Request) -> None:
        """Return the request's blocks, tail first, so the prefix's head stays cached longest."""
        self.pool.free(list(reversed(request.blocks)))
        request.blocks = []
        request.num_offered_blocks = 0

    def _extend_hashes(self, request: Request) -> None:
        """Hash the request's new full blocks, chained from its last hash, or from its tenant's root (its
        params' `cache_salt`) for the first: a salted prompt finds only blocks of the same salt."""
        known = len(request.block_hashes)
        if (request.num_tokens // self.block_size) <= known:
            return
        parent = request.block_hashes[-1] if known else None
        tokens = request.all_token_ids
        request.block_hashes.extend(
            hash_token_blocks(tokens, self.block_size, known, parent, cache_salt=request.params.cache_salt)
        )
