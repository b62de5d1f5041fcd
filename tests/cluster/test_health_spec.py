"""The spec's health section carries the liveness policy: its defaults are the shared ones, and the
router is handed the same policy the controller judges heartbeats by."""

from __future__ import annotations

import pytest

from cluster.spec import SpecError, parse_spec
from wire.liveness import LivenessPolicy


def test_the_defaults_are_the_shared_liveness_policy():
    assert parse_spec({}).health.liveness() == LivenessPolicy()


@pytest.mark.parametrize("field, value", [("misses_before_dead", 0), ("silent_after_s", 0), ("stuck_factor", -1),
                                          ("stuck_floor_s", 0), ("max_failed_steps", 0),
                                          ("controller_max_restarts", -2)])  # fmt: skip
def test_a_policy_that_cannot_work_names_its_field(field, value):
    with pytest.raises(SpecError, match=f"health.{field}"):
        parse_spec({"health": {field: value}})


def test_the_router_judges_workers_by_the_specs_policy(tiny_model_dirs):
    from cluster.deployment import router_config

    health = {"timeout_s": 7, "misses_before_dead": 5, "silent_after_s": 45, "stuck_factor": 3, "stuck_floor_s": 120,
              "max_failed_steps": 2}  # fmt: skip
    config = router_config(parse_spec({"model": tiny_model_dirs["llama"], "health": health}))
    assert config.liveness == LivenessPolicy(5, 45, 3, 120, 2)
    assert config.worker_call_timeout_s == 7  # one load poll unanswered this long is one miss
