"""A router on loopback over prefill and decode actors on local Ray, for fault injection, and the report rows.

`fault_stack` starts the pools a test asks for (each worker with its own
config: faults, policies, timeouts), registers them and serves; `kill_9`
kills an actor's process as `kill -9` does (`pid_of` for other signals). `record` appends one row of the
reliability table to the JSON lines file named by TANDEM_FAULT_REPORT
(scripts/bench_faults.py sets it and turns the rows into RELIABILITY.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import types

from decode_worker.actor import DecodeActor
from decode_worker.worker import DecodeWorkerConfig
from engine import EngineArgs
from prefill_worker.actor import PrefillActor
from runtime.ray_group import start_worker_actor
from prefill_worker.worker import PrefillWorkerConfig
from router.app import create_app
from router.config import RouterConfig
from router.server import RouterServer
from tests.e2e.harness import wait_for
from tests.e2e.router_cluster import _remote

REPORT_ENV = "TANDEM_FAULT_REPORT"


@contextlib.contextmanager
def fault_stack(ray, args: EngineArgs, config: RouterConfig, prefill: list[PrefillWorkerConfig],
                decode: list[DecodeWorkerConfig]):  # fmt: skip
    """Yield the stack: `.server`, `.registry`, `.actors` (name -> handle). Every actor is killed on exit."""
    actors = {c.name: start_worker_actor(PrefillActor, args, c) for c in prefill}
    actors.update({c.name: start_worker_actor(DecodeActor, args, c) for c in decode})
    app = create_app(config)
    ray.get([a.is_idle.remote() for a in actors.values()])  # built
    registry = app.state.router.registry
    for c in prefill:
        registry.register(c.name, "prefill", _remote(ray, actors[c.name]))
    for c in decode:
        registry.register(c.name, "decode", _remote(ray, actors[c.name]))
    server = RouterServer(app, port=0)
    try:
        yield types.SimpleNamespace(server=server, app=app, registry=registry, actors=actors)
    finally:
        server.stop()
        for actor in actors.values():
            ray.kill(actor, no_restart=True)


def pid_of(ray, actor) -> int:
    """The process id of the actor's worker process (to signal it)."""
    return ray.get(actor.__ray_call__.remote(lambda _: os.getpid()))


def kill_9(ray, actor) -> None:
    """SIGKILL the actor's process: no cleanup, no goodbye, as a crashed worker."""
    os.kill(pid_of(ray, actor), signal.SIGKILL)


def leaked_blocks(ray, stack, survivors: list[str]) -> int:
    """Once every surviving worker is idle: the blocks they still hold (0 when nothing leaked)."""
    handles = [stack.actors[name] for name in survivors]
    wait_for(lambda: all(ray.get([a.is_idle.remote() for a in handles])), "the survivors to go idle", 90.0)
    from wire.codec import decode
    from wire.requests import WorkerLoad

    loads = [decode(payload, WorkerLoad) for payload in ray.get([a.load.remote() for a in handles])]
    return sum(load.total_blocks - load.free_blocks for load in loads)


def record(fault: str, in_flight: int, completed: int, lost: int, leaked: int, restarts: int | None = None,
           timeouts: str = "defaults") -> None:  # fmt: skip
    """One row of the reliability table (restarts: worker restarts seen, None without a controller)."""
    path = os.environ.get(REPORT_ENV)
    if path:
        row = {"fault": fault, "timeouts": timeouts, "in_flight": in_flight, "completed": completed, "lost": lost,
               "restarts": "–" if restarts is None else restarts, "leaked_blocks": leaked}  # fmt: skip
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")
