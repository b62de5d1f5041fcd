"""Each worker rank on cores of its own on one machine: decode from the top, prefill from the bottom above
what is left to the serve process; kept across restarts, given back on removal; unpinned when it does not fit."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from cluster.controller import Controller
from cluster.core_map import CoreMap, core_map_for
from cluster.layout import Machines
from cluster.heartbeat import Answer
from cluster.spec import parse_spec
from tests.cluster.fakes import EchoRouter, FakeLauncher
from tests.e2e.harness import wait_for

EIGHT = tuple(range(8))
HERE = Machines(nodes=1, local_cpus=8, gpus=0.0)  # one machine, no GPU


def _spec(prefill=1, decode=1, threads=1, tp=1, **extra):
    return parse_spec({"prefill": {"replicas": prefill, "torch_threads": threads, "tensor_parallel_size": tp},
                       "decode": {"replicas": decode, "torch_threads": threads, "tensor_parallel_size": tp},
                       "health": {"restart_backoff_s": 0}, **extra})  # fmt: skip


def test_decode_takes_the_top_prefill_the_bottom_above_the_serve_processes_cores():
    cores = core_map_for(_spec(prefill=1, decode=2, threads=2), HERE, EIGHT)
    assert cores.reserve == 2
    assert cores.claim("decode-0", "decode", 1, 2) == ((6, 7),)
    assert cores.claim("decode-1", "decode", 1, 2) == ((4, 5),)
    assert cores.claim("prefill-0", "prefill", 1, 2) == ((2, 3),)
    assert cores.claim("decode-0", "decode", 1, 2) == ((6, 7),)  # a restart keeps its cores
    assert cores.claim("decode-2", "decode", 1, 2) == ()  # no room: unpinned
    cores.release("decode-1")
    assert cores.claim("decode-2", "decode", 1, 2) == ((4, 5),)
    assert "serve process and Ray: 0,1" in cores.describe()


def test_a_tensor_parallel_worker_gets_a_set_per_rank():
    assert CoreMap(EIGHT).claim("prefill-0", "prefill", 2, 3) == ((0, 1, 2), (3, 4, 5))


def test_no_map_when_off_or_a_pool_takes_torchs_default_threads():
    assert core_map_for(_spec(cpu_pinning=False), HERE, EIGHT) is None
    assert core_map_for(_spec(threads=None), HERE, EIGHT) is None
    assert core_map_for(_spec(prefill=0, decode=1, threads=8), HERE, EIGHT).reserve == 0
    assert core_map_for(_spec(), Machines(nodes=2, local_cpus=8, gpus=0.0), EIGHT) is None
    assert core_map_for(_spec(), Machines(nodes=1, local_cpus=8, gpus=1.0), EIGHT) is None


def test_the_serve_process_goes_on_the_leftover_else_on_prefills_cores_else_everywhere():
    assert core_map_for(_spec(threads=2), HERE, EIGHT).serve == (0, 1, 2, 3)
    assert core_map_for(_spec(threads=1), HERE, (0, 1)).serve == (0,)  # 1P+1D on 2 cores: prefill's core
    assert core_map_for(_spec(prefill=0, decode=1, threads=2), HERE, (0, 1)).serve == (0, 1)


def test_the_controller_launches_each_worker_on_its_cores_and_a_restart_on_the_same():
    spec = _spec(prefill=1, decode=1, threads=1)
    router, launcher = EchoRouter(), FakeLauncher()
    controller = Controller(spec, router, launcher, cores=core_map_for(spec, HERE, (0, 1, 2)))
    try:
        controller.scale({"prefill": 1, "decode": 1})
        assert launcher.core_sets == {"prefill-0": [((1,),)], "decode-0": [((2,),)]}
        (decode,) = controller.pool("decode")
        decode.ranks[0].answer = Answer(error="ActorDiedError: died", gone=True)
        (restart,) = [controller.replace(failure) for failure in controller.check_health()]
        wait_for(lambda: not restart.is_alive(), "the restart", timeout_s=60)
        assert launcher.core_sets["decode-0"] == [((2,),), ((2,),)]
        controller.scale({"prefill": 0})
        assert "prefill-0" not in controller.cores.held
    finally:
        controller.shutdown()
        router.close()


def test_a_pinned_process_keeps_every_thread_on_its_cores_those_started_later_too():
    core = min(os.sched_getaffinity(0))
    script = textwrap.dedent(f"""
        import os, threading, time
        from runtime.cpu_pinning import pin_this_process
        before = threading.Thread(target=time.sleep, args=(2,)); before.start()
        print(pin_this_process(({core},)))
        seen = []
        after = threading.Thread(target=lambda: seen.append(os.sched_getaffinity(0))); after.start(); after.join()
        print(os.sched_getaffinity(before.native_id), seen[0])
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert out.stdout.split("\n")[:2] == [f"({core},)", f"{{{core}}} {{{core}}}"], out.stdout + out.stderr
