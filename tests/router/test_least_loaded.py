from collections import Counter

import pytest

from wire.requests import WorkerLoad
from router.policy import make_policy
from router.worker_state import WorkerState


def test_of_two_candidates_the_one_with_fewer_pending_wins():
    policy = make_policy("least_loaded", seed=0)
    workers = [WorkerState(f"p{i}", "prefill", in_flight=load) for i, load in enumerate([5, 0, 9, 3])]
    picks = Counter(policy.pick([1, 2, 3], workers).name for _ in range(400))
    assert "p2" not in picks  # the busiest loses every pair it is drawn into
    assert picks["p1"] > picks["p3"] > picks["p0"] > 0  # the idlest wins 3 pairs of 6, p3 2, p0 1
    assert picks["p1"] == pytest.approx(200, abs=40)


def test_reported_load_counts_as_pending():
    policy = make_policy("least_loaded", seed=1)
    busy = WorkerState("p0", "prefill")
    busy.load = WorkerLoad("p0", waiting=6, running=2, transferring=0, free_blocks=10, total_blocks=100,
                           prefix_cache_hit_rate=0.0)  # fmt: skip
    idle = WorkerState("p1", "prefill", in_flight=1)
    assert all(policy.pick([1], [busy, idle]) is idle for _ in range(20))


def test_same_seed_same_choices_and_a_single_worker_needs_no_draw():
    workers = [WorkerState(f"p{i}", "prefill") for i in range(4)]
    first, second = make_policy("least_loaded", seed=7), make_policy("least_loaded", seed=7)
    assert [first.pick([1], workers).name for _ in range(30)] == [second.pick([1], workers).name for _ in range(30)]
    assert make_policy("least_loaded").pick([1], workers[:1]) is workers[0]
    with pytest.raises(ValueError):
        make_policy("least_loaded").pick([1], [])
