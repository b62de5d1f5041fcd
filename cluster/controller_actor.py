"""The controller as a Ray actor, and the handle the serving process holds on it.

    ControllerActor    a threaded actor holding the `Controller` (pools, health watch,
                       restarts, drain) and the `Membership` the router syncs with
                       over its membership socket (`cluster.membership_service`)
    ControllerClient   the serving process's view: start, scale, status, members, shutdown

The actor sits on the serving process's node (the router's, usually the head), so
a scale or a restart never waits on another machine to reach the router. It is
threaded (`max_concurrency`): a scale in progress, status calls, the health watch
and restarts run at the same time, and the router's long poll on its own thread.

Every part can die and the rest goes on: the workers are detached actors named
in the deployment's namespace (`cluster.actor_names`), so they outlive this
actor; Ray restarts this actor (`health.controller_max_restarts`) and retries
the calls it was running, and the restarted actor takes the workers over
(`cluster.adoption`: none restarted, the router's registry unchanged) with the
pool sizes of its last scale (`cluster.ledger`). The actor is detached and named
in that namespace too, so that it outlives the serving process's Ray job; it
watches that process and ends the deployment once it is gone (`cluster.orphans`).
Ownership: the actor owns every worker it launched or adopted; `shutdown` stops
them all, and `cluster.reaper` sweeps up after an actor that could not.
"""

from __future__ import annotations

import functools
import logging

from cluster import ledger
from cluster.actor_names import CONTROLLER, detached
from cluster.controller import Controller
from cluster.membership import Membership
from cluster.membership_service import MembershipService
from cluster.orphans import ServingProcess, watch_serving_process
from cluster.spec import ClusterSpec, SpecError
from cluster.workers import launch
from runtime.cpu_pinning import pin_this_process
from wire.socket_security import ClusterKey

logger = logging.getLogger("tandem.cluster")


class ControllerActor:
    def __init__(self, spec: ClusterSpec, namespace: str | None = None, serving: ServingProcess | None = None):
        """`namespace`: the deployment's (workers named and detached there); None: workers die with this actor.
        `serving`: the process the router runs in; once it is gone, the deployment ends (`cluster.orphans`)."""
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
        self.namespace = namespace
        self.membership = Membership(ack_timeout_s=spec.health.timeout_s * 3)
        remember = functools.partial(ledger.save_sizes, namespace) if namespace else None
        cores = _core_map(spec)
        if cores is not None:  # off the workers' cores, beside the router (it is mostly idle)
            pin_this_process(cores.serve)
        self.controller = Controller(spec, self.membership, functools.partial(launch, namespace=namespace), remember,
                                     cores=cores)  # fmt: skip
        self.started = namespace is not None and _restarted()
        if self.started:
            self._take_over(spec)
        if serving is not None and (serving.alive() or self.started):
            watch_serving_process(serving, self._end_orphaned)
        elif serving is not None:  # another pid namespace (a container, a Ray client): never end on a false alarm
            logger.warning("the serving process (pid %d) is not visible from here: the deployment will not end "
                           "by itself if it dies", serving.pid)  # fmt: skip
        # Last: the router's first sync must see the workers taken over, never an empty membership.
        key = ClusterKey.parse(spec.cluster_key) if spec.cluster_key else None
        self.membership_service = MembershipService(self.membership, key, spec.router_key)  # as long as this process

    def _take_over(self, spec: ClusterSpec) -> None:
        """Before any call is served (the router's sync among them): the workers the last incarnation left."""
        from cluster.adoption import Found, find_workers

        try:
            found, sizes = find_workers(spec, self.namespace, spec.health.timeout_s), ledger.load_sizes(self.namespace)
        except Exception:  # failing here would leave the actor dead for good: start over instead
            logger.exception("could not find the workers of the last incarnation; starting the pools anew")
            found, sizes = Found(), None
        self.controller.resume(found.serving, found.broken, sizes)

    def _end_orphaned(self) -> None:
        """The serving process is gone without stopping the deployment: stop every worker, then this actor."""
        import ray

        from cluster.reaper import reap

        logger.warning("the serving process is gone: stopping every worker and the controller")
        try:
            self.controller.shutdown()
            if self.namespace is not None:
                reap(self.namespace, keep=CONTROLLER)
        finally:
            ray.kill(ray.get_runtime_context().current_actor, no_restart=True)

    def start(self) -> None:
        """Launch the pools and watch them (once: on a restarted actor, where Ray retries this call,
        `resume` already brings the pools to size)."""
        if self.started:
            return
        self.started = True
        self.controller.start()

    def ping(self) -> bool:
        return True

    def scale(self, sizes: dict[str, int | None]) -> str | None:
        """None when done; the `SpecError` message when the sizes are invalid (nothing changed)."""
        try:
            self.controller.scale(sizes)
        except SpecError as err:
            return str(err)
        return None

    def status(self) -> dict:
        from cluster.status import cluster_status

        return cluster_status(self.controller)

    def members(self) -> tuple:
        """(spec, workers): the PoolWorkers with their Ray handles, as of now."""
        return self.controller.members()

    def membership_address(self) -> str:
        """Where the router syncs (`cluster.router_sync`): a new port after each restart of this actor."""
        return self.membership_service.address

    def shutdown(self) -> None:
        self.controller.shutdown()


def _restarted() -> bool:
    """Whether Ray restarted this actor (its state is gone; its workers are not)."""
    import warnings

    import ray

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Ray's property warns about an API it uses inside
        return ray.get_runtime_context().was_current_actor_reconstructed


def _core_map(spec: ClusterSpec):
    """This machine's cores to hand out, a set per worker rank, when the deployment is this machine alone
    without GPUs (`cluster.core_map`); None otherwise."""
    import os

    from cluster.core_map import core_map_for
    from cluster.layout import Machines

    return core_map_for(spec, Machines.of_ray_cluster(), tuple(os.sched_getaffinity(0)))


def start_controller(spec: ClusterSpec, namespace: str | None = None):
    """The actor, pinned to this process's node; returns its handle (the engines start with `start`).

    Ray restarts it when it dies and retries the calls it was running (`max_task_retries`): every method is
    safe to run again (scale takes absolute sizes, status and membership_address only read). With a namespace it is
    detached and named there like the workers: it outlives this process's Ray job (a `tandem serve` killed
    on a cluster that goes on), watches this process and ends the deployment once it is gone."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    actor = ray.remote(ControllerActor).options(num_cpus=0, max_concurrency=16, scheduling_strategy=here,
                                                max_restarts=spec.health.controller_max_restarts,
                                                max_task_retries=-1, **detached(namespace, CONTROLLER))  # fmt: skip
    return actor.remote(spec, namespace, ServingProcess.this() if namespace else None)


class ControllerClient:
    """Blocking calls on the actor, for the CLI, the admin endpoints (on a thread) and tests."""

    def __init__(self, handle, call_timeout_s: float = 3600.0):
        self.handle, self.call_timeout_s = handle, call_timeout_s

    def _get(self, ref):
        import ray

        return ray.get(ref, timeout=self.call_timeout_s)

    def start(self) -> None:
        self._get(self.handle.start.remote())

    def scale(self, sizes: dict[str, int | None]) -> None:
        """Raises `SpecError` on invalid sizes; returns once added workers serve and removed ones drained."""
        error = self._get(self.handle.scale.remote(sizes))
        if error is not None:
            raise SpecError(error)

    def status(self) -> dict:
        return self._get(self.handle.status.remote())

    def members(self) -> tuple:
        return self._get(self.handle.members.remote())

    def ping(self, timeout_s: float) -> None:
        """Returns once the actor answers (a restarting one answers when it is back); raises
        `ray.exceptions.ActorDiedError` when it is dead for good, GetTimeoutError after `timeout_s`."""
        import ray

        ray.get(self.handle.ping.remote(), timeout=timeout_s)

    @property
    def spec(self) -> ClusterSpec:
        return self.members()[0]

    @property
    def workers(self) -> dict:
        return {w.name: w for w in self.members()[1]}

    def pool(self, role: str) -> list:
        return [w for w in self.members()[1] if w.role == role]

    def shutdown(self) -> None:
        """Every worker it knows stopped, then the actor itself (raises if the actor is dead for good)."""
        import ray

        try:
            self._get(self.handle.shutdown.remote())
        finally:
            ray.kill(self.handle, no_restart=True)
