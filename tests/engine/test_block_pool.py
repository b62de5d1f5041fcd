"""Block pool invariants: ref counts, free list, prefix hash chain, LRU eviction."""

import pytest

from engine.block_pool import BlockPool, hash_block_tokens, hash_token_blocks


def test_allocate_and_free_return_every_block():
    pool = BlockPool(8)
    a = pool.allocate(3)
    b = pool.allocate(5)
    assert pool.num_free_blocks == 0
    with pytest.raises(RuntimeError):
        pool.allocate(1)
    pool.free(a)
    pool.free(b)
    assert pool.num_free_blocks == 8
    assert all(block.ref_count == 0 for block in pool.blocks)


def test_double_free_is_an_error():
    pool = BlockPool(2)
    (block,) = pool.allocate(1)
    pool.free([block])
    with pytest.raises(RuntimeError):
        pool.free([block])


def test_hash_chain_hits_only_identical_prefixes():
    a = hash_token_blocks([1, 2, 3, 4, 5, 6, 7, 8], block_size=4)
    b = hash_token_blocks([1, 2, 3, 4, 5, 6, 7, 9], block_size=4)
    c = hash_token_blocks([0, 2, 3, 4, 5, 6, 7, 8], block_size=4)
    assert a[0] == b[0] and a[1] != b[1]
    # Same second block tokens after a different first block: different hash (chained).
    assert c[0] != a[0] and c[1] != a[1]
    assert hash_block_tokens(None, [5, 6, 7, 8]) != a[1]
    # Partial trailing blocks are never hashed.
    assert len(hash_token_blocks([1, 2, 3, 4, 5], block_size=4)) == 1


def test_cached_free_block_is_reused_by_touch_and_evicted_lru():
    pool = BlockPool(3)
    blocks = pool.allocate(3)
    hashes = [hash_block_tokens(None, [i]) for i in range(3)]
    for block, h in zip(blocks, hashes):
        pool.cache_block(block, h)
    pool.free(blocks)  # freed in order 0, 1, 2: block 0 is evicted first
    assert pool.num_free_blocks == 3 and pool.num_cached_blocks == 3
    hit = pool.lookup(hashes[1])
    assert hit is blocks[1]
    pool.touch([hit])
    assert hit.ref_count == 1 and pool.num_free_blocks == 2
    (fresh,) = pool.allocate(1)
    assert fresh is blocks[0] and pool.lookup(hashes[0]) is None  # LRU eviction forgot its hash
    assert pool.lookup(hashes[2]) is blocks[2]
    pool.free([hit, fresh])
    assert pool.num_free_blocks == 3


def test_caching_disabled_never_hits():
    pool = BlockPool(2, enable_caching=False)
    (block,) = pool.allocate(1)
    h = hash_block_tokens(None, [1, 2])
    pool.cache_block(block, h)
    assert pool.lookup(h) is None


def test_uncached_free_blocks_are_reused_before_cached_ones_are_evicted():
    pool = BlockPool(4)
    cached, plain = pool.allocate(2)
    h = hash_block_tokens(None, [1])
    pool.cache_block(cached, h)
    pool.free([cached, plain])
    first, second = pool.allocate(2)
    assert first is plain  # the uncached block comes back first
    assert pool.lookup(h) is cached  # and the cached prefix survives
    assert second.block_id not in (cached.block_id, plain.block_id)
