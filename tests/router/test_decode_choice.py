import pytest

from wire.requests import WorkerLoad
from router.policy import make_decode_policy, make_pool_policies
from router.worker_state import WorkerState


def decode_worker(name: str, free_blocks: int | None, running: int = 0, in_flight: int = 0) -> WorkerState:
    worker = WorkerState(name, "decode", in_flight=in_flight)
    if free_blocks is not None:
        worker.load = WorkerLoad(name, waiting=0, running=running, transferring=0, free_blocks=free_blocks,
                                 total_blocks=1000, prefix_cache_hit_rate=0.0)  # fmt: skip
    return worker


PROMPT = list(range(160))  # 10 blocks of 16, plus 4 blocks of headroom by default


def test_fewest_pending_among_workers_with_room():
    policy = make_decode_policy()
    workers = [decode_worker("d0", 900, running=5), decode_worker("d1", 20, running=1), decode_worker("d2", 13)]
    assert policy.pick(PROMPT, workers).name == "d1"  # d2 is idle but 13 < 14 blocks
    workers.append(decode_worker("d3", 500, running=1))
    assert policy.pick(PROMPT, workers).name == "d3"  # as busy as d1, more free blocks


def test_dispatches_since_the_last_report_count():
    policy = make_decode_policy()
    workers = [decode_worker("d0", 400, running=1, in_flight=4), decode_worker("d1", 300, running=2)]
    assert policy.pick(PROMPT, workers).name == "d1"


def test_without_room_anywhere_the_most_free_blocks():
    policy = make_decode_policy(block_size=16, headroom_blocks=0)
    workers = [decode_worker("d0", 3), decode_worker("d1", 9, running=8), decode_worker("d2", 5)]
    assert policy.pick(PROMPT, workers).name == "d1"


def test_a_worker_that_has_not_reported_counts_as_having_room():
    policy = make_decode_policy()
    workers = [decode_worker("d0", 5), decode_worker("fresh", None)]
    assert policy.pick(PROMPT, workers).name == "fresh"
    with pytest.raises(ValueError):
        make_decode_policy(block_size=0)


def test_colocated_the_prompts_policy_chooses_among_the_workers_with_room():
    _, decode = make_pool_policies("cache_aware", {"block_size": 16}, 16, colocated=True)
    d0, d1 = decode_worker("d0", 900), decode_worker("d1", 900)
    assert decode.pick(PROMPT, [d0, d1]).name == "d0"  # a new prefix: the first of two empty trees
    assert decode.pick(PROMPT, [d0, d1]).name == "d0"  # the same prompt again: where its prefix is cached
    full = decode_worker("d0", 13)  # its cache filled since: 13 free blocks < 10 + 4
    assert decode.pick(PROMPT, [full, d1]).name == "d1"  # not queued behind a full cache, prefix or not
    assert decode.pick(PROMPT, [full, decode_worker("d1", 2)]).name == "d0"  # no room anywhere: the policy alone
    decode.forget("d1")  # d1 (which took it once) died: only d0 is remembered to hold the prefix
    assert decode.pick(PROMPT, [decode_worker("d1", 900), decode_worker("d0", 900)]).name == "d0"
    make_decode_policy().forget("d0")  # KV room remembers nothing
