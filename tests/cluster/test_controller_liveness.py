"""When the controller takes a worker for dead: what the router cannot see (a rank's process gone, or out of
Ray's reach for long, judged by the spec's liveness policy), and the router's own verdict.

Readiness answers are scripted (`tests.cluster.fakes`) and the clock is moved by hand: a worker slow to
answer is never restarted; one Ray reports dead is restarted at once; one that stays silent is restarted
once the policy says so, and so is a TP group whose follower died. A worker wedged in a step or failing
every step is the router's to judge (`tests/router/test_registry.py`); the controller acts on its verdict.
"""

from __future__ import annotations

import pytest

from cluster.controller import Controller
from cluster.heartbeat import Answer
from cluster.spec import parse_spec
from tests.cluster.fakes import EchoRouter, FakeClock, FakeLauncher
from tests.e2e.harness import wait_for

GONE = Answer(error="ActorDiedError: the actor died unexpectedly", gone=True)
HEALTH = {"timeout_s": 10, "misses_before_dead": 4, "silent_after_s": 40, "stuck_factor": 4, "stuck_floor_s": 300,
          "max_failed_steps": 3, "restart_backoff_s": 0}  # fmt: skip


def _controller(tp_size: int = 1):
    spec = parse_spec({"prefill": {"replicas": 0}, "decode": {"replicas": 1}, "health": HEALTH})
    clock, router, launcher = FakeClock(), EchoRouter(), FakeLauncher(tp_size)
    controller = Controller(spec, router, launcher, clock=clock)
    controller.scale({"decode": 1})
    return controller, router, launcher, clock


@pytest.fixture
def cluster():
    controller, router, launcher, clock = _controller()
    yield controller, launcher, clock
    controller.shutdown()
    router.close()


def _decode0(controller):
    (worker,) = controller.pool("decode")
    return worker, worker.ranks[0]


def test_a_slow_worker_that_answers_is_never_restarted(cluster):
    controller, launcher, clock = cluster
    worker, probe = _decode0(controller)
    for _ in range(20):
        probe.answer = None  # each heartbeat comes back only after a few timeouts...
        for _ in range(HEALTH["misses_before_dead"]):
            assert controller.check_health() == []
            clock.now += HEALTH["timeout_s"]
        probe.answer = Answer()  # ...then it answers
        assert controller.check_health() == []
    assert launcher.names() == ["decode-0"] and not worker.killed


def test_a_worker_ray_reports_dead_is_restarted_at_once(cluster):
    controller, launcher, _ = cluster
    worker, probe = _decode0(controller)
    probe.answer = GONE
    (failure,) = controller.check_health()
    assert failure.worker is worker and "Ray reports it dead (ActorDiedError" in failure.reason
    controller.replace(failure).join(30)
    new, _ = _decode0(controller)
    assert worker.killed and new is not worker and new.restarts == 1
    assert launcher.names() == ["decode-0", "decode-0"]
    assert controller.check_health() == []  # the new one has a watch of its own, and answers


def test_a_silent_worker_is_dead_after_the_policys_misses_and_silence(cluster):
    controller, _, clock = cluster
    _, probe = _decode0(controller)
    probe.answer = None
    assert controller.check_health() == []  # the heartbeat goes out
    for _ in range(HEALTH["misses_before_dead"] - 1):
        clock.now += HEALTH["timeout_s"]
        assert controller.check_health() == []  # a miss, not yet dead
    clock.now += HEALTH["timeout_s"]
    (failure,) = controller.check_health()
    assert "no heartbeat answered for 40 s" in failure.reason


def test_a_failed_call_is_a_miss_not_a_death(cluster):
    controller, _, clock = cluster
    _, probe = _decode0(controller)
    probe.answer = Answer(error="GetTimeoutError: Ray could not reach it for now")
    for _ in range(HEALTH["misses_before_dead"] - 1):
        assert controller.check_health() == []
        clock.now += HEALTH["timeout_s"] * 2
    probe.answer = Answer()
    assert controller.check_health() == []  # answered again: the misses are forgotten
    probe.answer = Answer(error="GetTimeoutError: Ray could not reach it for now")
    assert controller.check_health() == []


def test_a_dead_tensor_parallel_follower_takes_its_group_down():
    controller, router, _, _ = _controller(tp_size=2)
    try:
        (worker,) = controller.pool("decode")
        worker.ranks[1].answer = GONE  # rank 0 still answers: its step would hang in a collective
        (failure,) = controller.check_health()
        assert failure.worker is worker and failure.reason.startswith("heartbeat of rank 1: Ray reports it dead")
        controller.replace(failure).join(30)
        assert worker.killed and controller.pool("decode")[0].restarts == 1
    finally:
        controller.shutdown()
        router.close()


def test_a_worker_the_router_marked_dead_is_restarted(cluster):
    controller, _, _ = cluster
    worker, _ = _decode0(controller)
    controller.router.dead.add("decode-0")
    wait_for(lambda: not controller.router.snapshot()["decode-0"].alive, "the router's report")
    (failure,) = controller.check_health()
    assert failure.worker is worker and failure.reason == "the router marked it dead"
