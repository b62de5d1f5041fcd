"""A scale launches the new workers of every pool before it waits for any: their actors import and build their
engines at the same time (the launcher is a fake, `tests.cluster.fakes`)."""

from __future__ import annotations

import pytest

from cluster.controller import Controller
from cluster.core_map import CoreMap
from cluster.spec import parse_spec
from tests.cluster.fakes import EchoRouter, FakeLauncher


def test_both_pools_are_launched_before_the_first_worker_is_waited_for():
    spec = parse_spec({"prefill": {"replicas": 1}, "decode": {"replicas": 2}})
    router, launcher = EchoRouter(), FakeLauncher()
    controller = Controller(spec, router, launcher)
    launched_when_waited: list[list[str]] = []
    launcher.building["prefill-0"] = lambda: launched_when_waited.append(launcher.names())
    try:
        controller.scale({"prefill": 1, "decode": 2})
        assert launched_when_waited == [["prefill-0", "decode-0", "decode-1"]]  # prefill first: it claims cores first
        assert sorted(controller.workers) == ["decode-0", "decode-1", "prefill-0"]
        controller.scale({"prefill": 2, "decode": 1})  # up and down at once: the new one serves, the newest left
        assert sorted(controller.workers) == ["decode-0", "prefill-0", "prefill-1"]
    finally:
        controller.shutdown()
        router.close()


def test_a_launch_that_raises_takes_down_the_workers_launched_before_it_of_either_pool():
    spec = parse_spec({"prefill": {"replicas": 1, "torch_threads": 1}, "decode": {"replicas": 1, "torch_threads": 1}})
    router, launcher = EchoRouter(), FakeLauncher()

    def launch(spec, role, name, restarts=0, core_sets=()):
        if name == "decode-0":
            raise RuntimeError("no room for decode-0")
        return launcher(spec, role, name, restarts, core_sets)

    cores = CoreMap((0, 1))
    controller = Controller(spec, router, launch, cores=cores)
    try:
        with pytest.raises(RuntimeError, match="no room"):
            controller.scale({"prefill": 1, "decode": 1})
        (prefill,) = launcher.launched
        assert prefill.name == "prefill-0" and prefill.killed  # not left running, unregistered
        assert not controller.workers
        assert launcher.core_sets["prefill-0"] == [((0,),)]  # it had claimed a core, as decode-0 had before it raised
        assert not cores.held  # both given back: the next launch finds them free
    finally:
        controller.shutdown()
        router.close()
