"""Stand-ins for what the controller drives on Ray, so its decisions are tested without Ray or a model.

    FakeWorker     a PoolWorker's interface; its ranks' heartbeats are `ScriptedProbe`s
    FakeLauncher   `launch`'s signature; records every worker it starts, can hold them while "building"
    EchoRouter     the router's side of a real `Membership`: applies every wanted change at once
    FakeClock      the heartbeats' clock, moved by hand
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field

from cluster.heartbeat import Answer
from cluster.membership import Membership
from wire.membership import MemberView, MembershipReport


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class ScriptedProbe:
    """A rank whose next heartbeat answer the test sets: `answer` (None: it does not answer yet)."""

    def __init__(self, rank: int):
        self.rank, self.answer, self.sent = rank, Answer(), 0

    def send(self) -> int:
        self.sent += 1
        return self.sent

    def poll(self, call) -> Answer | None:
        return self.answer


@dataclass
class FakeWorker:
    name: str
    role: str
    restarts: int = 0
    tp: object = None
    tp_size: int = 1
    node_id: str = "fake-node-0"
    actor_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    control_address: str = "tcp://127.0.0.1:1"  # nobody listens: nothing here calls it
    sender_key: str = ""
    quick_deaths: int = 0
    started_at: float = field(default_factory=time.monotonic)
    building: object = None  # called by wait_ready, e.g. a Barrier's wait or an Event's wait
    killed: bool = False
    ranks: list = field(default_factory=list)

    def __post_init__(self):
        self.ranks = [ScriptedProbe(rank) for rank in range(self.tp_size)]

    def wait_ready(self, timeout_s: float, stop=None) -> None:
        if self.building is not None:
            self.building()
        if stop is not None and stop.is_set():
            raise InterruptedError(self.name)

    def probes(self) -> list[ScriptedProbe]:
        return self.ranks

    def is_idle(self, timeout_s: float) -> bool:
        return True

    def stop(self, timeout_s: float = 60.0) -> bool:
        self.killed = True
        return True

    def kill(self) -> None:
        self.killed = True

    def endpoint(self, key=None) -> FakeEndpoint:
        return FakeEndpoint(self.name)


@dataclass
class FakeEndpoint:
    name: str

    def close(self) -> None:
        pass


class FakeLauncher:
    """`launch(spec, role, name, restarts, core_sets)`; `building[name]` (if set) runs inside that worker's
    `wait_ready`."""

    def __init__(self, tp_size: int = 1):
        self.tp_size = tp_size
        self.launched: list[FakeWorker] = []
        self.building: dict[str, object] = {}
        self.core_sets: dict[str, list] = {}  # name -> the core sets each of its launches got
        self._lock = threading.Lock()

    def __call__(self, spec, role: str, name: str, restarts: int = 0, core_sets=()) -> FakeWorker:
        worker = FakeWorker(name, role, restarts, tp_size=self.tp_size, building=self.building.get(name))
        with self._lock:
            self.launched.append(worker)
            self.core_sets.setdefault(name, []).append(core_sets)
        return worker

    def names(self) -> list[str]:
        with self._lock:
            return [w.name for w in self.launched]


class EchoRouter(Membership):
    """A `Membership` whose router applies every change at once, alive unless named in `dead`."""

    def __init__(self):
        super().__init__(ack_timeout_s=30.0, poll_s=0.01)
        self.dead: set[str] = set()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        version, wanted = -1, ()
        while not self._stopped.is_set():
            views = tuple(MemberView(e.name, e.incarnation, e.name not in self.dead, e.draining, 0) for e in wanted)
            reply = self.sync(MembershipReport(version, views))
            version, wanted = reply.version, reply.members

    def close(self) -> None:
        self._stopped.set()
        self._thread.join(5)
