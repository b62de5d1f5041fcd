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


def test_eviction_drops_least_recent_prompts_and_leaves_before_parents():
    tree = PrefixTree(max_blocks_per_worker=6)
    shared = list(range(32))  # two blocks every prompt shares
    first = block_keys(shared + [1] * 32, 16)
    second = block_keys(shared + [2] * 32, 16)
    third = block_keys(shared + [3] * 32, 16)
    tree.insert("p0", first)
    tree.insert("p0", second)
    assert tree.num_blocks("p0") == 6
    tree.insert("p0", third)  # two blocks over the cap: the least recent leaves go, first's tail
    assert tree.num_blocks("p0") == 6
    assert tree.match_length("p0", third) == 4 and tree.match_length("p0", second) == 4
    assert tree.match_length("p0", first) == 2  # its shared prefix stays: recent prompts touched it


def test_a_lower_cap_on_insert_trims_that_worker_only():
    tree = PrefixTree(max_blocks_per_worker=100)
    keys = block_keys(list(range(160)), 16)
    tree.insert("p0", keys)
    tree.insert("p1", keys, cap=4)
    assert tree.num_blocks("p0") == 10 and tree.num_blocks("p1") == 4
    assert tree.match_length("p1", keys) == 4  # the deepest blocks went first


def test_forget_removes_a_worker_and_nothing_else():
    tree = PrefixTree(max_blocks_per_worker=100)
    keys = block_keys(list(range(64)), 16)
    tree.insert("p0", keys)
    tree.insert("p1", keys)
    tree.forget("p0")
    tree.forget("never-seen")
    assert tree.match_length("p0", keys) == 0 and tree.num_blocks("p0") == 0
    assert tree.match_length("p1", keys) == 4 and list(tree.workers()) == ["p1"]

