import pytest

from router.block_keys import block_keys
from router.prefix_tree import PrefixTree


def test_block_keys_name_whole_prefixes():
    a = block_keys(list(range(40)), 8)
    b = block_keys(list(range(24)) + [999] + list(range(25, 40)), 8)
    assert len(a) == 5 and len(block_keys(list(range(47)), 8)) == 5  # the partial block has no key
    assert a[:3] == b[:3] and a[3] != b[3] and a[4] != b[4]  # a change in block 3 renames 3 and every later block
    moved = block_keys(list(range(8, 16)) + list(range(8)), 8)
    assert moved[1] not in a  # the same tokens at another depth are another block


def test_block_keys_accept_any_int_sequence():
    assert block_keys(tuple(range(32)), 16) == block_keys(range(32), 16) == block_keys(list(range(32)), 16)
    with pytest.raises(ValueError):
        block_keys([1, 2], 0)


def test_match_length_counts_leading_blocks_only():
    tree = PrefixTree(max_blocks_per_worker=100)
    keys = block_keys(list(range(64)), 16)
    tree.insert("p0", keys[:3])
    assert tree.match_length("p0", keys) == 3
    assert tree.match_length("p0", keys[:2]) == 2
    assert tree.match_length("p1", keys) == 0
    other = block_keys([5] * 16 + list(range(16, 64)), 16)
    assert tree.match_length("p0", other) == 0  # a different first block shares nothing downstream


def test_insert_twice_keeps_one_copy_per_block():
    tree = PrefixTree(max_blocks_per_worker=100)
    keys = block_keys(list(range(64)), 16)
    tree.insert("p0", keys)
    tree.insert("p0", keys[:2])
    assert tree.num_blocks("p0") == 4


def test_eviction_drops_the_older_generation_whole():
    tree = PrefixTree(max_blocks_per_worker=12)  # generations of 6 blocks
    shared = list(range(32))  # two blocks every prompt shares
    prompts = [block_keys(shared + [turn] * 32, 16) for turn in range(5)]  # 4 blocks each, 2 of them shared
    tree.insert("p0", prompts[0])
    tree.insert("p0", prompts[1])  # 6 distinct blocks: the current generation is full
    tree.insert("p0", prompts[2])  # does not fit: 0 and 1 become the previous generation
    assert [tree.match_length("p0", keys) for keys in prompts] == [4, 4, 4, 2, 2]  # 3, 4: the shared prefix
    tree.insert("p0", prompts[3])
    tree.insert("p0", prompts[4])  # rolls again: 0 and 1 are gone, but for the prefix the others share
    assert [tree.match_length("p0", keys) for keys in prompts] == [2, 2, 4, 4, 4]
    assert tree.num_blocks("p0") == 10


def test_memory_stays_bounded_and_recent_blocks_stay_remembered():
    tree = PrefixTree(max_blocks_per_worker=40)
    recent = []
    for turn in range(200):
        keys = block_keys([turn % 7] * 64 + [turn] * (16 * (turn % 5)), 16)
        tree.insert("p0", keys)
        recent = (recent + [keys])[-3:]
        assert tree.num_blocks("p0") <= 40
        assert all(tree.match_length("p0", keys) == len(keys) for keys in recent)  # 3 x 8 blocks < 20


def test_the_workers_cache_size_sizes_its_generations():
    tree = PrefixTree(max_blocks_per_worker=100)
    keys = block_keys(list(range(160)), 16)
    tree.insert("p0", keys)
    tree.insert("p1", keys, cache_blocks=4)
    assert tree.num_blocks("p0") == 10 and tree.num_blocks("p1") == 4
    assert tree.match_length("p1", keys) == 4  # the shallow blocks are the ones kept
    tree.insert("p1", block_keys(list(range(500, 600)), 16), cache_blocks=4)
    assert tree.num_blocks("p1") == 8 and tree.match_length("p1", keys) == 4


def test_forget_removes_a_worker_and_nothing_else():
    tree = PrefixTree(max_blocks_per_worker=100)
    keys = block_keys(list(range(64)), 16)
    tree.insert("p0", keys)
    tree.insert("p1", keys)
    tree.forget("p0")
    tree.forget("never-seen")
    assert tree.match_length("p0", keys) == 0 and tree.num_blocks("p0") == 0
    assert tree.match_length("p1", keys) == 4 and list(tree.workers()) == ["p1"]

