"""Restarts run in parallel, each on its own thread, and never wait for a scale in progress.

The launcher is a fake (`tests.cluster.fakes`) whose workers can be held while
"building": a restart that waited for another, or for a scale, would leave a
barrier broken or a replacement unlaunched.
"""

from __future__ import annotations

import threading

from cluster.controller import Controller
from cluster.heartbeat import Answer
from cluster.spec import parse_spec
from tests.cluster.fakes import EchoRouter, FakeLauncher
from tests.e2e.harness import wait_for

GONE = Answer(error="ActorDiedError: the actor died unexpectedly", gone=True)


def _controller(prefill: int, decode: int):
    spec = parse_spec({"prefill": {"replicas": prefill}, "decode": {"replicas": decode},
                       "health": {"restart_backoff_s": 0}})  # fmt: skip
    router, launcher = EchoRouter(), FakeLauncher()
    controller = Controller(spec, router, launcher)
    controller.scale({"prefill": prefill, "decode": decode})
    return controller, router, launcher


def _kill(worker) -> None:
    worker.ranks[0].answer = GONE


def test_dead_workers_are_restarted_at_the_same_time():
    controller, router, launcher = _controller(prefill=1, decode=2)
    try:
        old = {w.name: w for w in controller.members()[1]}
        together = threading.Barrier(len(old), timeout=60)  # each replacement builds only once all are building
        launcher.building.update({name: together.wait for name in old})
        for worker in old.values():
            _kill(worker)
        restarts = [controller.replace(failure) for failure in controller.check_health()]
        assert len(restarts) == 3
        wait_for(lambda: together.broken or not any(t.is_alive() for t in restarts), "the restarts", timeout_s=120)
        assert not together.broken
        assert all(controller.workers[name] is not worker and controller.workers[name].restarts == 1
                   for name, worker in old.items())  # fmt: skip
        assert {e.name: e.incarnation for e in router._wanted.values()} == {
            name: w.actor_id for name, w in controller.workers.items()}  # fmt: skip
        assert not any("did not start again" in e for e in controller.events)
    finally:
        controller.shutdown()
        router.close()


def test_a_scale_in_progress_does_not_hold_a_restart_back():
    controller, router, launcher = _controller(prefill=0, decode=1)
    try:
        (old,) = controller.pool("decode")
        building = threading.Event()
        launcher.building["decode-1"] = lambda: building.wait(60)  # the scale's new worker builds until released
        scaling = threading.Thread(target=controller.scale, args=({"decode": 2},))
        scaling.start()
        wait_for(lambda: "decode-1" in launcher.names(), "the scale to launch decode-1")
        _kill(old)
        (failure,) = controller.check_health()
        controller.replace(failure).join(60)
        assert controller.workers["decode-0"] is not old and controller.workers["decode-0"].restarts == 1
        assert scaling.is_alive()  # the restart finished while the scale still waits for decode-1
        building.set()
        scaling.join(60)
        assert sorted(controller.workers) == ["decode-0", "decode-1"]
    finally:
        controller.shutdown()
        router.close()


def test_a_worker_scaled_away_while_restarting_is_not_brought_back():
    controller, router, launcher = _controller(prefill=1, decode=1)
    try:
        (old,) = controller.pool("prefill")
        building = threading.Event()
        launcher.building["prefill-0"] = lambda: building.wait(60)
        _kill(old)
        (failure,) = controller.check_health()
        restart = controller.replace(failure)
        wait_for(lambda: launcher.names().count("prefill-0") == 2, "the replacement to launch")
        controller.scale({"prefill": 0})  # removes prefill-0 while its replacement builds
        building.set()
        restart.join(60)
        replacement = launcher.launched[-1]
        assert replacement.name == "prefill-0" and replacement.killed
        assert "prefill-0" not in controller.workers and "prefill-0" not in router._wanted
    finally:
        controller.shutdown()
        router.close()
