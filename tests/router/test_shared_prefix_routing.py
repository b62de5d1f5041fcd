"""The issue's policy test: cache_aware against an oracle that knows the prompt groups.

Each simulated prefill worker keeps a real LRU prefix cache (an engine
`BlockPool`) sized to hold about its fair share of the system prompts, so a
policy that scatters a group pays in evictions (see shared_prefix_sim.py).
"""

import pytest

from router.policy import make_policy
from tests.router.shared_prefix_sim import Workload, simulate

UTILIZATION = 2.0  # offered load: twice what the pool could prefill if nothing were cached


def capacity_blocks(workload: Workload, num_workers: int) -> int:
    """A fair share of the system prompts plus a quarter, and room for the prompt being prefilled."""
    groups_per_worker = -(-workload.num_groups // num_workers)
    return int(groups_per_worker * workload.system_tokens // workload.block_size * 1.25) + 40


def oracle(group, tokens, workers):
    return workers[group % len(workers)]


def by_policy(name: str, **options):
    policy = make_policy(name, **options)
    return lambda group, tokens, workers: policy.pick(tokens, workers)


@pytest.mark.parametrize("num_workers, num_groups", [(2, 9), (3, 12), (4, 14)])
def test_cache_aware_nears_the_oracle_hit_rate_with_balanced_load(num_workers, num_groups):
    workload = Workload(num_groups=num_groups, prompts_per_group=40, seed=num_workers)
    capacity = capacity_blocks(workload, num_workers)
    outcomes = {
        name: simulate(workload, route, num_workers, capacity, UTILIZATION)
        for name, route in [
            ("oracle", oracle),
            ("cache_aware", by_policy("cache_aware")),
            ("round_robin", by_policy("round_robin")),
            ("least_loaded", by_policy("least_loaded", seed=0)),
        ]
    }
    best = outcomes["oracle"].hit_rate
    print(f"\n{num_workers} workers, {num_groups} groups, {capacity} blocks each:")
    for name, outcome in outcomes.items():
        print(
            f"  {name:13s} hit rate {outcome.hit_rate:.3f} ({outcome.hit_rate / best:.0%} of oracle)"
            f"  busiest/mean {outcome.load_ratio:.2f}  dispatched {outcome.dispatched}"
            f"  mean TTFT {outcome.mean_latency:.2f} x one uncached prefill"
        )
    cache_aware = outcomes["cache_aware"]
    assert cache_aware.hit_rate >= 0.9 * best
    assert cache_aware.load_ratio <= 1.5
    # The workload tells policies apart: scattering the groups thrashes the caches.
    assert outcomes["round_robin"].hit_rate < 0.8 * best


def test_the_simulated_cache_evicts_when_groups_do_not_fit():
    workload = Workload(num_groups=8, prompts_per_group=10, seed=1)
    roomy = simulate(workload, oracle, 1, capacity_blocks(workload, 1), UTILIZATION)
    cramped = simulate(workload, oracle, 1, capacity_blocks(workload, 4), UTILIZATION)
    assert cramped.hit_rate < 0.5 * roomy.hit_rate
    assert roomy.dispatched == [80] and roomy.hit_rate > 0.7


def test_the_busy_guard_spreads_a_hot_system_prompt():
    # Group 0 gets 1/(g+1)**2 popularity: about half of all prompts share one system prompt.
    workload = Workload(num_groups=14, prompts_per_group=40, popularity_skew=2.0, seed=4)
    capacity = capacity_blocks(workload, 4)
    guarded = simulate(workload, by_policy("cache_aware"), 4, capacity, utilization=3.0)
    unguarded = simulate(workload, by_policy("cache_aware", balance_abs_threshold=10**9), 4, capacity, 3.0)
    print(f"\nhot prompt: guarded TTFT {guarded.mean_latency:.2f} busiest/mean {guarded.load_ratio:.2f};"
          f" affinity only TTFT {unguarded.mean_latency:.2f} busiest/mean {unguarded.load_ratio:.2f}")  # fmt: skip
    assert guarded.mean_latency < 0.5 * unguarded.mean_latency  # simulated time, not wall clock
    assert guarded.load_ratio < unguarded.load_ratio
    assert guarded.hit_rate >= 0.95 * unguarded.hit_rate
