"""The workers the router may send to, both pools, and how it learns that one died.

Ownership: the registry owns every `WorkerState` and lives on the router's
event loop; `register` / `unregister` are called from outside (the cluster
controller) on that loop (`RouterServer.call_soon` from another thread).

Busy is not dead. A worker leaves the pool (marked dead: the routing policy
forgets it and the dispatcher resumes the requests it held elsewhere) only
  - when unregistered, or
  - on a verdict of its `wire.liveness.Liveness`, fed by the periodic `load()`
    poll (the heartbeat): misses in a row with its address refusing connections or
    silent for long, a wedged step, steps failing in a row.
A call that fails (a dispatch call or one heartbeat: timeout, connection down,
the worker's method raised) only makes it `suspect`: that request attempt fails
(the dispatcher resumes it), new requests avoid the worker while its pool has
another, and its next answered heartbeat clears it. A call the worker rejects
(ValueError) is the request's fault and leaves the worker as it was.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Sequence

from wire.liveness import Liveness, LivenessPolicy
from router.policy import RoutingPolicy, make_decode_policy
from router.worker_state import Role, WorkerState

logger = logging.getLogger("tandem.router")


class NoLiveWorker(RuntimeError):
    """No worker of a pool is alive: the request cannot be served now (HTTP 503)."""

    def __init__(self, role: Role):
        super().__init__(f"no {role} worker is alive")
        self.role = role


class WorkerFailed(RuntimeError):
    """A call to a worker failed: this request attempt is over (the worker is only suspect, not dead).

    `worker`: its name; `refused`: its address refuses connections (`WorkerGone.refused`)."""

    def __init__(self, reason: str, worker: str = "", refused: bool = False):
        super().__init__(reason)
        self.worker, self.refused = worker, refused


class GuardedEndpoint:
    """A worker's async endpoint whose failures raise `WorkerFailed` and are reported to `on_failure(name, why)`.

    A ValueError (also Ray's task error wrapping one) is the request's fault, not
    the worker's: it passes through and nothing is reported."""

    def __init__(self, endpoint, name: str, on_failure: Callable[[str, str], None]):
        self._endpoint, self._name, self._on_failure = endpoint, name, on_failure

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
                self._on_failure(self._name, reason)
                raise WorkerFailed(reason, self._name, getattr(err, "refused", False)) from err

        return guarded

    def close(self) -> None:
        """The endpoint's sockets go (a worker leaving the registry); endpoints without any have no `close`."""
        close = getattr(self._endpoint, "close", None)
        if close is not None:
            close()


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else ""


class WorkerRegistry:
    def __init__(self, policy: RoutingPolicy, decode_policy: RoutingPolicy | None = None,
                 liveness: LivenessPolicy = LivenessPolicy(), clock: Callable[[], float] = time.monotonic):  # fmt: skip
        self.policy = policy  # the prefill pool's (cache_aware, least_loaded, round_robin)
        self.decode_policy = decode_policy or make_decode_policy()
        self.liveness, self.clock = liveness, clock  # how workers are judged (`judge_by`); the clock for tests
        self.workers: dict[str, WorkerState] = {}
        self._dead_listeners: list[Callable[[WorkerState], None]] = []
        self._senders: dict[str, str] = {}  # sender public key -> worker name (`sender_name`)

    def judge_by(self, liveness: LivenessPolicy) -> None:
        """Judge workers by `liveness` from now on (the router app applies its `RouterConfig.liveness`
        to whichever registry it serves, also one the cluster built)."""
        self.liveness = liveness
        for state in self.workers.values():
            state.liveness.policy = liveness

    # ---- membership (called by the cluster) -------------------------------
    def register(self, name: str, role: Role, endpoint, sender_key: str = "") -> WorkerState:
        """Add a worker; `endpoint` has async `reserve`/`prefill`, `abort`, `load` (a `router.control_client.ControlEndpoint`).

        `sender_key`: the public key its token deltas carry (wire.socket_security; "": unauthenticated)."""
        old = self.workers.get(name)
        if old is not None and old.alive:
            raise ValueError(f"worker {name!r} is already registered")
        if old is not None:  # a dead worker of that name comes back: its old connection goes
            old.endpoint.close()
        guarded = GuardedEndpoint(endpoint, name, self.mark_suspect)
        state = self.workers[name] = WorkerState(name, role, guarded, liveness=Liveness(self.liveness, self.clock),
                                                 sender_key=sender_key)  # fmt: skip
        self._index_senders()
        return state

    def unregister(self, name: str) -> None:
        """Out of the pool for good: marked dead (its requests fail or resume elsewhere), its endpoint closed."""
        self.mark_dead(name, "unregistered")
        state = self.workers.pop(name, None)
        if state is not None:
            state.endpoint.close()
        self._index_senders()

    def sender_name(self, public_key: str) -> str | None:
        """The registered worker whose token deltas carry `public_key` (None: none). Safe from any thread:
        the token stream's authenticator asks it at each connection."""
        return self._senders.get(public_key)

    def _index_senders(self) -> None:
        # A new dict each time, never changed in place: another thread may be reading the old one.
        self._senders = {w.sender_key: w.name for w in self.workers.values() if w.sender_key}

    def drain(self, name: str) -> None:
        """Send the worker no new requests; those it holds finish (then the cluster unregisters it)."""
        self.workers[name].draining = True

    def on_dead(self, listener: Callable[[WorkerState], None]) -> None:
        self._dead_listeners.append(listener)

    # ---- health ------------------------------------------------------------
    def mark_dead(self, name: str, reason: str) -> None:
        """Out of the pool (a liveness verdict, or unregistered): its requests are resumed elsewhere."""
        state = self.workers.get(name)
        if state is None or not state.alive:
            return
        logger.warning("worker %s is out of the pool: %s", name, reason)
        state.alive = False
        self.policy.forget(name)
        self.decode_policy.forget(name)
        for listener in self._dead_listeners:
            listener(state)

    def mark_suspect(self, name: str, reason: str) -> None:
        """A call to it failed: avoided by new requests until its next heartbeat is answered."""
        state = self.workers.get(name)
        if state is None or not state.alive:
            return
        if not state.suspect:
            logger.warning("worker %s is suspect: %s", name, reason)
        state.suspect = True

    # ---- choosing ----------------------------------------------------------
    def live(self, role: Role) -> list[WorkerState]:
        return [w for w in self.workers.values() if w.role == role and w.alive]

    def pickable(self, role: Role) -> list[WorkerState]:
        """Live and not draining: the workers new requests may go to."""
        return [w for w in self.live(role) if not w.draining]

    def trusted(self, role: Role) -> list[WorkerState]:
        """Pickable and not suspect: the workers new requests go to first."""
        return [w for w in self.pickable(role) if not w.suspect]

    def pick_prefill(self, tokens: Sequence[int], cache_salt: str | None = None) -> WorkerState:
        """A trusted prefill worker, by the routing policy (the dispatcher prefills on decode when none is)."""
        workers = self.trusted("prefill")
        if not workers:
            raise NoLiveWorker("prefill")
        return self.policy.pick(tokens, workers, cache_salt)

    def pick_decode(self, tokens: Sequence[int], cache_salt: str | None = None) -> WorkerState:
        """A trusted decode worker, else a suspect one (decode is the last resort: there is no other)."""
        workers = self.trusted("decode") or self.pickable("decode")
        if not workers:
            raise NoLiveWorker("decode")
        return self.decode_policy.pick(tokens, workers, cache_salt)

    # ---- heartbeats --------------------------------------------------------
    async def refresh_loads(self, timeout_s: float) -> None:
        """Read every live worker's `load()` at once and judge each by its answer (or its silence)."""
        workers = [w for w in self.workers.values() if w.alive]
        results = await asyncio.gather(*(asyncio.wait_for(w.endpoint.load(), timeout_s) for w in workers),
                                       return_exceptions=True)  # fmt: skip
        for worker, result in zip(workers, results):
            if worker.alive:  # not unregistered meanwhile
                self._judge(worker, result, timeout_s)

    def _judge(self, worker: WorkerState, result, timeout_s: float) -> None:
        if isinstance(result, BaseException):
            if isinstance(result, asyncio.TimeoutError):
                reason = f"load() got no answer within {timeout_s:g} s"
            elif isinstance(result, WorkerFailed):
                reason = str(result)
            else:
                reason = f"load() failed: {type(result).__name__}: {_first_line(result)}"
            self.mark_suspect(worker.name, reason)
            verdict = worker.liveness.missed(reason, refused=getattr(result, "refused", False))
        else:
            worker.load, worker.suspect = result, False
            worker.prompt_rate.observe(result)
            verdict = worker.liveness.answered(result)
        if verdict is not None:
            self.mark_dead(worker.name, verdict)

    async def keep_loads_fresh(self, interval_s: float, timeout_s: float) -> None:
        """Run until cancelled: a refresh every `interval_s`."""
        while True:
            await self.refresh_loads(timeout_s)
            await asyncio.sleep(interval_s)
