"""The controller: keeps each pool at its size, with every worker registered with the router and alive.

    start()          launch both pools, wait until built, register each with the router
    resume(...)      a restarted controller: adopt the workers found serving (`cluster.adoption`),
                     replace the broken ones, bring the pools back to their recorded sizes
    watch thread     every health.interval_s: each worker's heartbeats (`cluster.heartbeat`,
                     judged by `wire.liveness`: several misses, not one slow answer) and
                     the router's view of it; a dead worker is replaced on a thread of its own:
                     unregister (the router migrates its requests), kill, wait out a backoff
                     when it keeps dying soon after starting (`cluster.restart_backoff`),
                     launch again under the same name, register
    scale(sizes)     up: launch, wait, register; down: drain the newest (router sends it
                     nothing new), wait until the router holds nothing on it and it is
                     idle, unregister, stop
    shutdown()       stop watching, unregister and stop every worker

Concurrency: scales run one at a time (`_scaling`); each restart runs on its own
thread, at the same time as other restarts and as a scale. `_lock` guards only
the dicts (`workers`, `_restarting`) and is never held while waiting on a worker
or on the router.

Ownership: the controller owns every worker it launched or adopted and kills
each one it removes or replaces. It runs in the controller actor
(`cluster.controller_actor`) and reaches the router's registry only through
`cluster.membership.Membership` (register / drain / unregister / adopt / snapshot,
each applied by the router's next sync).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from cluster.autoscaler import Autoscaler
from cluster.core_map import CoreMap
from cluster.heartbeat import WorkerWatch
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
    def __init__(self, spec: ClusterSpec, router, launcher=launch, remember_sizes=None, clock=time.monotonic,
                 cores: CoreMap | None = None):  # fmt: skip
        """`router`: register(worker) / unregister(name) / drain(name) / adopt(workers) / snapshot(), e.g. a
        `Membership`. `launcher(spec, role, name, restarts, core_sets=)` starts a worker
        (`cluster.workers.launch`); `remember_sizes(sizes)` keeps each scale's pool sizes for a restarted
        controller (`cluster.ledger`); `clock` times heartbeats (tests pass their own); `cores`: the machine's
        cores to hand out, a set per rank (`cluster.core_map`; None: every rank on every core)."""
        self.spec, self.router, self.launcher, self.clock, self.cores = spec, router, launcher, clock, cores
        self.remember_sizes = remember_sizes or (lambda sizes: None)
        self.workers: dict[str, PoolWorker] = {}
        self.events: list[str] = []  # what the controller did, newest last (status shows the tail)
        self._names = {role: itertools.count() for role in ROLES}
        self._lock = threading.Lock()  # the dicts only
        self._scaling = threading.Lock()  # one scale at a time
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []  # the watch and the autoscaler
        self._restarting: dict[str, threading.Thread] = {}  # name -> the thread replacing it
        self._watches: dict[str, WorkerWatch] = {}  # the watch thread's own

    # ---- pools -------------------------------------------------------------
    def start(self) -> None:
        """Launch both pools and register them; then watch health on a thread."""
        self.scale({role: self.spec.pool(role).replicas for role in ROLES})
        if self.cores is not None:
            self._log(self.cores.describe())
        self._start_threads()

    def resume(self, serving: list[PoolWorker], broken: list[tuple[PoolWorker, str]], sizes: dict | None) -> None:
        """Take over the workers a previous controller left (`cluster.adoption.Found`): the serving ones as
        they are (the router keeps them), the broken ones replaced; then the pools back to `sizes`."""
        with self._lock:
            for worker in sorted([*serving, *(w for w, _ in broken)], key=_launch_order):
                self.workers[worker.name] = worker
                self._claim_cores(worker.role, worker.name)  # as they were claimed at launch (same order)
                index = int(worker.name.rsplit("-", 1)[1])
                self._names[worker.role] = itertools.count(max(index + 1, next(self._names[worker.role])))
        self.router.adopt(serving)
        self._log(f"controller restarted: adopted {len(serving)} serving workers, {len(broken)} to replace")
        self._start_threads()
        for worker, why in broken:
            self.replace(WorkerFailure(worker, f"found broken after the controller's restart: {why}"))
        wanted = sizes or {role: self.spec.pool(role).replicas for role in ROLES}
        threading.Thread(target=self._scale_quietly, args=(wanted,), name="tandem-resume", daemon=True).start()

    def scale(self, sizes: dict[str, int]) -> None:
        """Bring each named pool ({"prefill": 2}) to its size; returns once new workers serve and removed ones left."""
        overrides = {f"{role}.replicas": n for role, n in sizes.items() if n is not None}
        with self._scaling:
            self.spec = with_overrides(self.spec, overrides)  # SpecError (a ValueError) on a bad size
            self._remember_sizes()
            self._add([(role, name) for role in ROLES for name in self._names_to_add(role)])
            for role in ROLES:
                size, current = self.spec.pool(role).replicas, self.pool(role)
                if len(current) > size:
                    self._remove([w.name for w in current[size:]])  # the newest

    def members(self) -> tuple[ClusterSpec, list[PoolWorker]]:
        """The spec and workers as of now, without waiting for a scale in progress."""
        with self._lock:
            return self.spec, list(self.workers.values())

    def pool(self, role: str) -> list[PoolWorker]:
        return [w for w in self.members()[1] if w.role == role]

    def _names_to_add(self, role: str) -> list[str]:
        missing = self.spec.pool(role).replicas - len(self.pool(role))
        return [f"{role}-{next(self._names[role])}" for _ in range(missing)]

    def _add(self, launches: list[tuple[str, str]]) -> None:
        """Start a worker per (role, name), every pool's at once: the actors import and build their engines at
        the same time (a deployment's first start waited for the prefill pool before it launched decode's)."""
        started: list[PoolWorker] = []
        try:  # a launch that raises takes down those launched before it, of either pool
            for role, name in launches:
                started.append(self._launch(role, name, 0))
            for worker in started:
                worker.wait_ready(self.spec.health.start_timeout_s, self._stop)
        except BaseException:
            for worker in started:
                worker.kill()
            for _, name in launches:  # claimed at each launch, the one that raised too: free for the next
                self._release_cores(name)
            raise
        for worker in started:
            self.router.register(worker)
            with self._lock:
                self.workers[worker.name] = worker
            self._log(f"{worker.name} serving on node {worker.node_id[:12]}")

    def _remove(self, names: list[str]) -> None:
        """Drain all, then stop each: no request they hold is dropped."""
        for name in names:
            self.router.drain(name)
        deadline = time.monotonic() + self.spec.health.drain_timeout_s
        while not all(self._drained(name) for name in names) and time.monotonic() < deadline:
            time.sleep(0.05)
        for name in names:
            with self._lock:  # by name: a restart may have replaced the worker meanwhile (it then kills its own)
                worker = self.workers.pop(name, None)
            self.router.unregister(name)
            self._release_cores(name)
            if worker is not None:
                clean = worker.stop(self.spec.health.timeout_s)
                self._log(f"{name} removed ({'drained' if clean else 'stopped before its blocks were free'})")

    def _launch(self, role: str, name: str, restarts: int) -> PoolWorker:
        """A worker of `role` named `name`, on its own cores when the machine's map has room for it."""
        return self.launcher(self.spec, role, name, restarts, core_sets=self._claim_cores(role, name))

    def _release_cores(self, name: str) -> None:
        if self.cores is not None:
            self.cores.release(name)

    def _claim_cores(self, role: str, name: str) -> tuple[tuple[int, ...], ...]:
        if self.cores is None:
            return ()
        pool = self.spec.pool(role)
        return self.cores.claim(name, role, pool.tensor_parallel_size, pool.torch_threads or 0)

    def _drained(self, name: str) -> bool:
        view = self.router.snapshot().get(name)
        worker = self.workers.get(name)
        if view is None or not view.alive or worker is None:
            return True
        try:
            return view.in_flight == 0 and worker.is_idle(self.spec.health.timeout_s)
        except Exception:
            return True  # died while draining: nothing left to wait for

    def _remember_sizes(self) -> None:
        try:
            self.remember_sizes({role: self.spec.pool(role).replicas for role in ROLES})
        except Exception:
            logger.exception("could not record the pool sizes (a restarted controller would use older ones)")

    def _scale_quietly(self, sizes: dict[str, int]) -> None:
        try:
            self.scale(sizes)
        except InterruptedError:
            pass
        except Exception:
            logger.exception("bringing the pools back to %s failed", sizes)

    # ---- health ------------------------------------------------------------
    def check_health(self) -> list[WorkerFailure]:
        """The workers found dead now (never blocks): marked dead by the router, or their heartbeats say so.

        Workers being replaced are left out; so are heartbeats still in flight (`cluster.heartbeat`)."""
        with self._lock:
            workers = [w for w in self.workers.values() if w.name not in self._restarting]
        states = self.router.snapshot()
        failures = []
        for worker in workers:
            state = states.get(worker.name)  # absent: not synced yet (just adopted), not dead
            try:
                dead_to_router = state is not None and not state.alive
                reason = "the router marked it dead" if dead_to_router else self._watch(worker).check()
            except Exception:  # a fault of ours, not the worker's: no restart for it, and the others still watched
                logger.exception("reading %s's heartbeat failed", worker.name)
                continue
            if reason is not None:
                failures.append(WorkerFailure(worker, reason))
                self._watches.pop(worker.name, None)
        for name in set(self._watches) - {w.name for w in workers}:
            del self._watches[name]  # removed, or being replaced: its successor gets a new watch
        return failures

    def _watch(self, worker: PoolWorker) -> WorkerWatch:
        watch = self._watches.get(worker.name)
        if watch is None or watch.worker is not worker:
            health = self.spec.health
            watch = WorkerWatch(worker, worker.probes(), health.liveness(), health.timeout_s, self.clock)
            self._watches[worker.name] = watch
        return watch

    def replace(self, failure: WorkerFailure) -> threading.Thread | None:
        """Replace a dead worker under its name, on a thread of its own (returned; None when it is already
        being replaced, or was removed or replaced meanwhile)."""
        name = failure.worker.name
        with self._lock:
            if self._stop.is_set() or name in self._restarting or self.workers.get(name) is not failure.worker:
                return None
            thread = threading.Thread(target=self._replace, args=(failure,), name=f"tandem-restart-{name}", daemon=True)
            self._restarting[name] = thread
        thread.start()
        return thread

    def _replace(self, failure: WorkerFailure) -> None:
        old = failure.worker
        try:
            quick_deaths = self._take_down(old, failure.reason)
            restarts, delay = old.restarts + 1, restart_delay(quick_deaths, self.spec.health)
            while not self._stop.wait(delay) and self._wanted(old):
                try:
                    new = self._relaunch(old, restarts, quick_deaths)
                except InterruptedError:
                    return  # shutting down
                except Exception as err:
                    quick_deaths, restarts = quick_deaths + 1, restarts + 1  # a launch may leave its name taken
                    # At least a watch interval between failed launches, even with no backoff configured.
                    delay = max(restart_delay(quick_deaths, self.spec.health), self.spec.health.interval_s)
                    self._log(f"{old.name} did not start again ({type(err).__name__}: {err}); "
                              f"retrying in {delay:.1f} s")  # fmt: skip
                    continue
                self._install(old, new)
                return
        except Exception:
            logger.exception("replacing %s failed; the watch will try again", old.name)
        finally:
            with self._lock:
                self._restarting.pop(old.name, None)

    def _take_down(self, old: PoolWorker, reason: str) -> int:
        """Out of the router (its requests migrate), killed; returns its streak of quick deaths."""
        self.router.unregister(old.name)
        old.kill()
        quick_deaths = next_streak(old.quick_deaths, time.monotonic() - old.started_at, self.spec.health)
        delay = restart_delay(quick_deaths, self.spec.health)
        wait = f"restarting in {delay:.1f} s ({quick_deaths} quick deaths in a row)" if delay else "restarting"
        self._log(f"{old.name} is dead ({reason}): {wait}")
        return quick_deaths

    def _relaunch(self, old: PoolWorker, restarts: int, quick_deaths: int) -> PoolWorker:
        new = self._launch(old.role, old.name, restarts)
        try:
            new.wait_ready(self.spec.health.start_timeout_s, self._stop)
        except BaseException:
            new.kill()
            raise
        new.quick_deaths = quick_deaths
        return new

    def _install(self, old: PoolWorker, new: PoolWorker) -> None:
        """The router first (it may send to `new` once it is in `workers`), then the pool, unless the
        name was removed (scaled down) or the controller stops meanwhile: then `new` goes again."""
        self.router.register(new)
        with self._lock:
            wanted = self._wanted(old) and not self._stop.is_set()
            if wanted:
                self.workers[old.name] = new
        if not wanted:
            self.router.unregister(new.name)
            new.kill()
            return
        self._log(f"{new.name} restarted on node {new.node_id[:12]}")

    def _wanted(self, old: PoolWorker) -> bool:
        return self.workers.get(old.name) is old

    def _watch_loop(self) -> None:
        while not self._stop.wait(self.spec.health.interval_s):
            try:
                for failure in self.check_health():
                    self.replace(failure)
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
    def _start_threads(self) -> None:
        loops = [(self._watch_loop, "tandem-controller")]
        if self.spec.autoscale.enabled:
            loops.append((self._autoscale, "tandem-autoscaler"))
        for target, name in loops:
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def shutdown(self) -> None:
        """Stop watching and restarting, then unregister and stop every worker (each is killed even if it hangs)."""
        self._stop.set()  # a launch waiting for its worker gives up (InterruptedError) and kills it
        timeout = self.spec.health.timeout_s
        with self._lock:
            threads = [*self._threads, *self._restarting.values()]
        for thread in threads:
            thread.join(timeout)
        with self._scaling:
            with self._lock:
                workers, self.workers = list(self.workers.values()), {}
            if workers:
                with ThreadPoolExecutor(len(workers)) as pool:
                    list(pool.map(lambda w: self._stop_worker(w, timeout), workers))

    def _stop_worker(self, worker: PoolWorker, timeout_s: float) -> None:
        try:
            self.router.unregister(worker.name)
        except Exception:
            pass  # the router may be gone already
        worker.stop(timeout_s)

    def _log(self, event: str) -> None:
        logger.info(event)
        with self._lock:
            self.events = [*self.events[-49:], f"{time.strftime('%H:%M:%S')} {event}"]


def _launch_order(worker) -> tuple[int, int]:
    """Prefill before decode, by index: the order `scale` launches (and claims cores) in."""
    return ROLES.index(worker.role), int(worker.name.rsplit("-", 1)[1])
