"""The controller as a Ray actor, and the handle the serving process holds on it.

    ControllerActor    a threaded actor holding the `Controller` (pools, health watch,
                       restarts, drain) and the `Membership` the router syncs with
    ControllerClient   the serving process's view: start, scale, status, members, shutdown

The actor sits on the serving process's node (the router's, usually the head), so
a scale or a restart never waits on another machine to reach the router. It is
threaded (`max_concurrency`): the router's long-poll `sync`, a scale in progress,
status calls and the health watch run at the same time; the controller's lock
serialises changes to the pools. Ownership: the actor owns every worker it
launched; killing the actor without `shutdown` leaves them to Ray (they die with
the job that started them).
"""

from __future__ import annotations

from cluster.controller import Controller
from cluster.membership import Membership
from cluster.spec import ClusterSpec, SpecError


class ControllerActor:
    def __init__(self, spec: ClusterSpec):
        import logging

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
        self.membership = Membership(ack_timeout_s=spec.health.timeout_s * 3)
        self.controller = Controller(spec, self.membership)

    def start(self) -> None:
        self.controller.start()

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

    def sync(self, report: dict, known_version: int, latency_totals: dict | None = None) -> tuple:
        return self.membership.sync(report, known_version, latency_totals)

    def shutdown(self) -> None:
        self.controller.shutdown()


def start_controller(spec: ClusterSpec):
    """The actor, pinned to this process's node; returns its handle (the engines start with `start`)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    actor = ray.remote(ControllerActor).options(num_cpus=0, max_concurrency=16, scheduling_strategy=here)
    return actor.remote(spec)


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

    @property
    def spec(self) -> ClusterSpec:
        return self.members()[0]

    @property
    def workers(self) -> dict:
        return {w.name: w for w in self.members()[1]}

    def pool(self, role: str) -> list:
        return [w for w in self.members()[1] if w.role == role]

    def shutdown(self) -> None:
        """Every worker drained of nothing and stopped, then the actor itself."""
        import ray

        try:
            self._get(self.handle.shutdown.remote())
        finally:
            ray.kill(self.handle, no_restart=True)
