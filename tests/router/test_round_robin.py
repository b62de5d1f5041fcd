import pytest

from router.policy import make_policy
from router.worker_state import WorkerState


def test_round_robin_takes_turns_whatever_the_prompt():
    policy = make_policy("round_robin")
    workers = [WorkerState(f"p{i}", "prefill") for i in range(3)]
    picks = [policy.pick([7] * n, workers).name for n in range(7)]
    assert picks == ["p0", "p1", "p2", "p0", "p1", "p2", "p0"]


def test_unknown_policy_names_the_choices():
    with pytest.raises(ValueError, match="round_robin"):
        make_policy("fastest")
