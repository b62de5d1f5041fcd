"""The controller: keeps each pool at its size, with every worker registered with the router and alive.

    start()          launch both pools, wait until built, register each with the router
    watch thread     every health.interval_s: a worker is dead if the router marked it dead
                     (a failed call, a failed load refresh) or its heartbeat failed (Ray
                     actor death, or no answer within health.timeout_s): unregister, kill,
                     launch again under the same name, register (after a backoff when it
                     keeps dying soon after starting: `cluster.restart_backoff`)
    scale(role, n)   up: launch, wait, register; down: drain the newest (router sends it
                     nothing new), wait until the router holds nothing on it and it is
                     idle, unregister, stop
    shutdown()       stop watching, unregister and stop every worker

Ownership: the controller owns every `PoolWorker` it launched and kills each
one it removes or replaces. It runs in the controller actor
(`cluster.controller_actor`) and reaches the router's registry only through
`cluster.membership.Membership` (register / drain / unregister / snapshot,
each applied by the router's next sync). One lock serialises changes to the pools.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from dataclasses import dataclass

from cluster.autoscaler import Autoscaler
from cluster.restart_backoff import next_streak, restart_delay
from cluster.spec import ClusterSpec, with_overrides
from cluster.workers import PoolWorker, launch

logger = logging.getLogger("tandem.cluster")
ROLES = ("prefill", "decode")


@dataclass
class WorkerFailure:
    worker: PoolWorker
    reason: str


class Controller:
    def __init__(self, spec: ClusterSpec, router):
        """`router`: register(worker) / unregister(name) / drain(name) / snapshot(), e.g. a `Membership`."""
        self.spec, self.router = spec, router
        self.workers: dict[str, PoolWorker] = {}
        self.events: list[str] = []  # what the controller did, newest last (status shows the tail)
        self._names = {role: itertools.count() for role in ROLES}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._down: dict[str, tuple[float, int]] = {}  # dead, not yet restarted: name -> (not before, quick deaths)

    # ---- pools -------------------------------------------------------------
    def start(self) -> None:
        """Launch both pools and register them; then watch health on a thread."""
        self.scale({role: self.spec.pool(role).replicas for role in ROLES})
        self._watcher = threading.Thread(target=self._watch, name="tandem-controller", daemon=True)
        self._watcher.start()
        if self.spec.autoscale.enabled:
            threading.Thread(target=self._autoscale, name="tandem-autoscaler", daemon=True).start()

    def scale(self, sizes: dict[str, int]) -> None:
        """Bring each named pool ({"prefill": 2}) to its size; returns once new workers serve and removed ones left."""
        overrides = {f"{role}.replicas": n for role, n in sizes.items() if n is not None}
        with self._lock:
            self.spec = with_overrides(self.spec, overrides)  # SpecError (a ValueError) on a bad size
            for role in ROLES:
                self._resize(role, self.spec.pool(role).replicas)

    def members(self) -> tuple[ClusterSpec, list[PoolWorker]]:
        """The spec and workers as of now, without waiting for a scale in progress (dict.copy is atomic)."""
        return self.spec, list(self.workers.copy().values())

    def pool(self, role: str) -> list[PoolWorker]:
        return [w for w in self.workers.values() if w.role == role]

    def _resize(self, role: str, size: int) -> None:
        current = self.pool(role)
        if size > len(current):
            self._add([f"{role}-{next(self._names[role])}" for _ in range(size - len(current))], role)
        elif size < len(current):
            self._remove(current[size:])  # the newest

    def _add(self, names: list[str], role: str) -> None:
        # Launch all first: the actors build their engines at the same time.
        started = [launch(self.spec, role, name) for name in names]
        try:
            for worker in started:
                worker.wait_ready(self.spec.health.start_timeout_s, self._stop)
        except BaseException:
            for worker in started:
                worker.kill()
            raise
        for worker in started:
            self.router.register(worker)
            self.workers[worker.name] = worker
            self._log(f"{worker.name} serving on node {worker.node_id[:12]}")

    def _remove(self, workers: list[PoolWorker]) -> None:
        """Drain all, then stop each: no request they hold is dropped."""
        for worker in workers:
            self.router.drain(worker.name)
        deadline = time.monotonic() + self.spec.health.drain_timeout_s
        while not all(self._drained(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        for worker in workers:
            self.router.unregister(worker.name)
            del self.workers[worker.name]
            self._down.pop(worker.name, None)
            clean = worker.stop(self.spec.health.timeout_s)
            self._log(f"{worker.name} removed ({'drained' if clean else 'stopped before its blocks were free'})")

    def _drained(self, worker: PoolWorker) -> bool:
        import ray

        alive, _, in_flight, _ = self.router.snapshot().get(worker.name, (False, True, 0, None))
        if not alive:
            return True
        try:
            return in_flight == 0 and ray.get(worker.rank0.is_idle.remote(), timeout=self.spec.health.timeout_s)
        except Exception:
            return True  # died while draining: nothing left to wait for

    # ---- health ------------------------------------------------------------
    def check_health(self) -> list[WorkerFailure]:
        """The workers found dead now: marked dead by the router, or a heartbeat that failed or timed out."""
        import ray

        workers = list(self.workers.copy().values())  # no lock: a scale in progress must not stall the watch
        states = self.router.snapshot()
        marked_dead = [w for w in workers if not states.get(w.name, (False,))[0]]
        failures = [WorkerFailure(w, "the router marked it dead") for w in marked_dead]
        failed = {f.worker.name for f in failures}
        beats = [(w, w.heartbeats()) for w in workers if w.name not in failed]
        deadline = time.monotonic() + self.spec.health.timeout_s
        for worker, refs in beats:
            try:
                ray.get(refs, timeout=max(0.0, deadline - time.monotonic()))
            except Exception as err:
                failures.append(WorkerFailure(worker, f"heartbeat failed: {type(err).__name__}"))
        return failures

    def restart(self, failure: WorkerFailure) -> None:
        """Replace a dead worker under the same name (the router forgets the old one first).

        A worker in a crash loop waits out its backoff: until then each call returns at once
        (the watch calls again every interval while the worker is down)."""
        with self._lock:
            old = failure.worker
            if self.workers.get(old.name) is not old:
                return  # removed or replaced meanwhile
            if old.name not in self._down:
                self._take_down(old, failure.reason)
            not_before, quick_deaths = self._down[old.name]
            if time.monotonic() < not_before:
                return
            new = launch(self.spec, old.role, old.name)
            try:
                new.wait_ready(self.spec.health.start_timeout_s, self._stop)
            except BaseException:
                new.kill()
                self._down[old.name] = (self._not_before(quick_deaths + 1), quick_deaths + 1)
                raise
            del self._down[old.name]
            new.restarts, new.quick_deaths = old.restarts + 1, quick_deaths
            self.workers[new.name] = new
            self.router.register(new)
            self._log(f"{new.name} restarted on node {new.node_id[:12]}")

    def _take_down(self, old: PoolWorker, reason: str) -> None:
        """First sight of a death: out of the router, killed, and when it may come back."""
        self.router.unregister(old.name)
        old.kill()
        quick_deaths = next_streak(old.quick_deaths, time.monotonic() - old.started_at, self.spec.health)
        self._down[old.name] = (self._not_before(quick_deaths), quick_deaths)
        delay = restart_delay(quick_deaths, self.spec.health)
        wait = f"restarting in {delay:.1f} s ({quick_deaths} quick deaths in a row)" if delay else "restarting"
        self._log(f"{old.name} is dead ({reason}): {wait}")

    def _not_before(self, quick_deaths: int) -> float:
        return time.monotonic() + restart_delay(quick_deaths, self.spec.health)

    def _watch(self) -> None:
        while not self._stop.wait(self.spec.health.interval_s):
            try:
                for failure in self.check_health():
                    if self._stop.is_set():
                        return
                    self.restart(failure)
            except InterruptedError:
                return  # shutting down in the middle of a restart
            except Exception:
                logger.exception("health check failed; trying again")

    # ---- autoscaling ---------------------------------------------------------
    def _autoscale(self) -> None:
        """Every autoscale interval: resize the pools `cluster.autoscaler` asks for (one step each)."""
        autoscaler = Autoscaler(self.spec.autoscale)
        while not self._stop.wait(self.spec.autoscale.interval_s):
            try:
                spec, workers = self.members()
                sizes = {role: spec.pool(role).replicas for role in ROLES}
                members = {role: [w.name for w in workers if w.role == role] for role in ROLES}
                snapshot, totals = self.router.snapshot(), getattr(self.router, "latency_totals", {})
                changes = autoscaler.decide(sizes, members, snapshot, totals, time.monotonic())
                if changes and not self._stop.is_set():
                    self._log(f"autoscale: {', '.join(f'{r} {sizes[r]} -> {n}' for r, n in changes.items())}")
                    self.scale(changes)
            except InterruptedError:
                return
            except Exception:
                logger.exception("autoscaling step failed; trying again")

    # ---- lifetime ----------------------------------------------------------
    def shutdown(self) -> None:
        """Stop watching, then unregister and stop every worker (each is killed even if it hangs)."""
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(self.spec.health.start_timeout_s)
        with self._lock:
            for worker in list(self.workers.values()):
                try:
                    self.router.unregister(worker.name)
                except Exception:
                    pass  # the router may be gone already
                worker.stop(self.spec.health.timeout_s)
                del self.workers[worker.name]

    def _log(self, event: str) -> None:
        logger.info(event)
        self.events = [*self.events[-49:], f"{time.strftime('%H:%M:%S')} {event}"]
