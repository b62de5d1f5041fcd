import pytest

from wire.requests import WorkerLoad
from router.block_keys import block_keys
from router.policy import CacheAware, CacheAwareConfig, make_policy
from router.worker_state import WorkerState

SYSTEM_A = list(range(1000, 1256))  # 16 blocks of 16
SYSTEM_B = list(range(5000, 5256))


def pool(*in_flight: int) -> list[WorkerState]:
    return [WorkerState(f"p{i}", "prefill", in_flight=count) for i, count in enumerate(in_flight)]


def prompt(system: list[int], turn: int) -> list[int]:
    return system + [turn] * 40  # 18 full blocks in all


def remember(policy: CacheAware, worker: str, tokens: list[int], num_blocks: int | None = None) -> None:
    keys = block_keys(tokens, policy.config.block_size)
    policy.tree.insert(worker, keys[:num_blocks])


def test_follows_the_longest_prefix_match():
    policy = make_policy("cache_aware")
    workers = pool(0, 0, 0)
    home_a = policy.pick(prompt(SYSTEM_A, 1), workers)
    home_b = policy.pick(prompt(SYSTEM_B, 1), workers)
    assert home_a is not home_b  # a new prefix goes to a worker that remembers less
    for turn in range(2, 6):
        assert policy.pick(prompt(SYSTEM_A, turn), workers) is home_a
        assert policy.pick(prompt(SYSTEM_B, turn), workers) is home_b
    assert policy.decisions == {"cache": 8, "spread": 2}


def test_among_equal_matches_the_least_loaded_wins():
    policy = make_policy("cache_aware")
    workers = pool(2, 0)
    remember(policy, "p0", SYSTEM_A)
    remember(policy, "p1", SYSTEM_A)
    assert policy.pick(prompt(SYSTEM_A, 1), workers).name == "p1"
    workers[1].in_flight = 3
    assert policy.pick(prompt(SYSTEM_A, 2), workers).name == "p0"


def test_a_busy_worker_loses_its_traffic_to_the_best_match_among_the_rest():
    def pick_with_loads(*in_flight: int) -> str:
        policy = CacheAware(CacheAwareConfig(balance_abs_threshold=4, balance_rel_threshold=1.5))
        remember(policy, "p0", SYSTEM_A)
        remember(policy, "p1", SYSTEM_A, num_blocks=10)  # 10 of 18 blocks: above the 0.3 threshold
        return policy.pick(prompt(SYSTEM_A, 1), pool(*in_flight)).name

    # p0: 6 - 1 > 4 and 6 > 1.5 * 1: busy. p1 is not, and matches more than idle p2.
    assert pick_with_loads(6, 2, 1) == "p1"
    # 6 - 2 is not above 4: p0 keeps its affinity.
    assert pick_with_loads(6, 2, 2) == "p0"
    # 30 - 25 > 4 but 30 < 1.5 * 25: both thresholds must be crossed.
    assert pick_with_loads(30, 28, 25) == "p0"
    # p0 and p1 both busy: the idle worker, though it has nothing cached.
    assert pick_with_loads(9, 9, 0) == "p2"


def test_decisions_count_skipped_busy_workers():
    policy = make_policy("cache_aware")
    policy.pick(prompt(SYSTEM_A, 1), pool(20, 0))
    policy.pick(prompt(SYSTEM_A, 2), pool(0, 0))
    assert policy.decisions == {"spread": 1, "cache": 1, "skipped_busy": 1}


def test_in_a_pool_of_two_imbalance_means_the_least_loaded():
    policy = make_policy("cache_aware")  # defaults: abs 8, rel 1.5
    remember(policy, "p0", SYSTEM_A)
    assert policy.pick(prompt(SYSTEM_A, 1), pool(10, 1)).name == "p1"
    assert policy.pick(prompt(SYSTEM_A, 2), pool(10, 1)).name == "p1"  # p1 now matches too; still less loaded
    assert policy.pick(prompt(SYSTEM_A, 3), pool(11, 2)).name == "p1"


def test_a_small_match_is_not_worth_following():
    policy = make_policy("cache_aware", cache_threshold=0.5)
    remember(policy, "p0", SYSTEM_A, num_blocks=8)  # 8 of 18 blocks: below half
    remember(policy, "p0", SYSTEM_B)  # p0 also remembers more, so spreading picks p1
    assert policy.pick(prompt(SYSTEM_A, 1), pool(0, 0)).name == "p1"
    assert policy.decisions == {"spread": 1}


def test_forget_drops_a_dead_workers_affinity():
    policy = make_policy("cache_aware")
    workers = pool(0, 0)
    home = policy.pick(prompt(SYSTEM_A, 1), workers)
    policy.forget(home.name)
    survivors = [w for w in workers if w is not home]
    assert policy.pick(prompt(SYSTEM_A, 2), survivors) is survivors[0]
    assert policy.tree.num_blocks(home.name) == 0
    assert policy.pick(prompt(SYSTEM_A, 3), workers) is survivors[0]  # back in the pool, it starts cold


def test_the_tree_remembers_about_what_the_worker_reports_it_can_cache():
    policy = make_policy("cache_aware", max_blocks_per_worker=1000)
    worker = WorkerState("p0", "prefill")
    worker.load = WorkerLoad("p0", 0, 0, 0, free_blocks=12, total_blocks=12, prefix_cache_hit_rate=0.0)
    for system in (SYSTEM_A, SYSTEM_B, list(range(9000, 9256))):
        policy.pick(prompt(system, 1), [worker])
        assert 12 <= policy.tree.num_blocks("p0") <= 24


def test_block_size_option_and_prompts_shorter_than_a_block():
    policy = make_policy("cache_aware", block_size=32)
    workers = pool(0, 0)
    assert policy.pick([1, 2, 3], workers) in workers
    policy.pick(prompt(SYSTEM_A, 1), workers)
    assert policy.tree.num_blocks("p0") + policy.tree.num_blocks("p1") == 9  # 296 tokens // 32


def test_config_is_checked_and_frozen():
    with pytest.raises(ValueError):
        CacheAwareConfig(cache_threshold=1.5)
    with pytest.raises(ValueError):
        CacheAwareConfig(balance_rel_threshold=0.5)
    with pytest.raises(TypeError):
        make_policy("cache_aware", thresold=0.2)
    with pytest.raises(AttributeError):
        CacheAwareConfig().block_size = 8
    with pytest.raises(ValueError):
        make_policy("cache_aware").pick([1], [])
