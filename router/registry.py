"""The workers the router may send to, both pools, and how it learns that one died.

Ownership: the registry owns every `WorkerState` and lives on the router's
event loop; `register` / `unregister` are called from outside (the cluster
controller) on that loop (`RouterServer.call_soon` from another thread). A
worker leaves the pool when unregistered, or is marked dead when a call to it
fails (a `load()` in the periodic refresh, or any dispatch call): then the
routing policy forgets it and the dispatcher fails the requests it held.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable, Sequence

from router.policy import RoutingPolicy, make_decode_policy
from router.worker_state import Role, WorkerState

logger = logging.getLogger("tandem.router")


class NoLiveWorker(RuntimeError):
    """No worker of a pool is alive: the request cannot be served now (HTTP 503)."""

    def __init__(self, role: Role):
        super().__init__(f"no {role} worker is alive")
        self.role = role


class WorkerFailed(RuntimeError):
    """A call to a worker failed: the worker is marked dead (HTTP 503 for the request that saw it)."""


class GuardedEndpoint:
    """A worker's async endpoint whose failures mark the worker dead.

    A ValueError (also Ray's task error wrapping one) is the request's fault, not
    the worker's: it passes through and the worker stays alive."""

    def __init__(self, endpoint, on_failure: Callable[[str], None]):
        self._endpoint, self._on_failure = endpoint, on_failure

    def __getattr__(self, method: str):
        call = getattr(self._endpoint, method)

        async def guarded(*args):
            try:
                return await call(*args)
            except (ValueError, asyncio.CancelledError):
                raise
            except Exception as err:
                # Ray's messages run over many lines of internals: the first one says what happened.
                reason = f"{method} failed: {type(err).__name__}: {_first_line(err)}"
                self._on_failure(reason)
                raise WorkerFailed(reason) from err

        return guarded

    def close(self) -> None:
        """The endpoint's sockets go (a worker leaving the registry); endpoints without any have no `close`."""
        close = getattr(self._endpoint, "close", None)
        if close is not None:
            close()


def _first_line(err: Exception) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else ""


class WorkerRegistry:
    def __init__(self, policy: RoutingPolicy, decode_policy: RoutingPolicy | None = None):
        self.policy = policy  # the prefill pool's (cache_aware, least_loaded, round_robin)
        self.decode_policy = decode_policy or make_decode_policy()
        self.workers: dict[str, WorkerState] = {}
        self._dead_listeners: list[Callable[[WorkerState], None]] = []

    # ---- membership (called by the cluster) -------------------------------
    def register(self, name: str, role: Role, endpoint) -> WorkerState:
        """Add a worker; `endpoint` has async `reserve`/`prefill`, `abort`, `load` (e.g. `AsyncEncodedCalls`)."""
        if name in self.workers and self.workers[name].alive:
            raise ValueError(f"worker {name!r} is already registered")
        guarded = GuardedEndpoint(endpoint, lambda reason: self.mark_dead(name, reason))
        state = self.workers[name] = WorkerState(name, role, guarded)
        return state

    def unregister(self, name: str) -> None:
        """Out of the pool for good: marked dead (its requests fail or resume elsewhere), its endpoint closed."""
        self.mark_dead(name, "unregistered")
        state = self.workers.pop(name, None)
        if state is not None:
            state.endpoint.close()

    def drain(self, name: str) -> None:
        """Send the worker no new requests; those it holds finish (then the cluster unregisters it)."""
        self.workers[name].draining = True

    def on_dead(self, listener: Callable[[WorkerState], None]) -> None:
        self._dead_listeners.append(listener)

    def mark_dead(self, name: str, reason: str) -> None:
        state = self.workers.get(name)
        if state is None or not state.alive:
            return
        logger.warning("worker %s is out of the pool: %s", name, reason)
        state.alive = False
        self.policy.forget(name)
        self.decode_policy.forget(name)
        for listener in self._dead_listeners:
            listener(state)

    # ---- choosing ----------------------------------------------------------
    def live(self, role: Role) -> list[WorkerState]:
        return [w for w in self.workers.values() if w.role == role and w.alive]

    def pickable(self, role: Role) -> list[WorkerState]:
        """Live and not draining: the workers new requests may go to."""
        return [w for w in self.live(role) if not w.draining]

    def pick_prefill(self, tokens: Sequence[int]) -> WorkerState:
        workers = self.pickable("prefill")
        if not workers:
            raise NoLiveWorker("prefill")
        return self.policy.pick(tokens, workers)

    def pick_decode(self, tokens: Sequence[int]) -> WorkerState:
        workers = self.pickable("decode")
        if not workers:
            raise NoLiveWorker("decode")
        return self.decode_policy.pick(tokens, workers)

    # ---- load --------------------------------------------------------------
    async def refresh_loads(self, timeout_s: float) -> None:
        """Read every live worker's `load()` at once; one that fails or times out is marked dead."""
        workers = [w for w in self.workers.values() if w.alive]
        results = await asyncio.gather(
            *(asyncio.wait_for(w.endpoint.load(), timeout_s) for w in workers), return_exceptions=True
        )
        for worker, result in zip(workers, results):
            if isinstance(result, BaseException):
                self.mark_dead(worker.name, f"load() failed: {type(result).__name__}: {result}")
            else:
                worker.load = result

    async def keep_loads_fresh(self, interval_s: float, timeout_s: float) -> None:
        """Run until cancelled: a refresh every `interval_s`."""
        while True:
            await self.refresh_loads(timeout_s)
            await asyncio.sleep(interval_s)
