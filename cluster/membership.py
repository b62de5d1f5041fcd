"""Who the router should send to, agreed between the controller actor and the router, in one place.

    controller actor                           router process (its event loop)
    register(worker) / drain / unregister      sync(report) every sync interval (a long poll on the
      changes the wanted membership,             controller's membership socket, `wire.membership`):
      waits until a report shows it applied      report: what its registry holds now
    snapshot()  the router's last report         reply: the wanted membership; it registers,
                                                 drains and unregisters to match

The controller and the router live in different processes (the controller is a
restartable Ray actor) and reach each other over one ZMQ control socket
(`cluster.membership_service`, `cluster.router_sync`); Ray only starts the
actor and tells the router where that socket is. The router stays the sole
owner of its registry; the controller owns the wanted membership.
`register`/`drain`/`unregister` return once the router applied the change (or
after `ack_timeout_s` if the router stops syncing: a router that is gone
cannot send anything anywhere), so "scaled" means "the router sees it".

A worker's incarnation is its rank 0's Ray actor id: the same to every
controller, so a restarted controller that adopts the workers (`adopt`) wants
exactly what the router holds, and the router changes nothing.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace

from wire.membership import MemberView, MembershipReport, WantedMember, WantedMembership


class Membership:
    """Lives in the controller actor; `sync` is the router's side of it, the rest the controller's (`RouterLink`)."""

    def __init__(self, ack_timeout_s: float = 30.0, poll_s: float = 0.25):
        self.ack_timeout_s, self.poll_s = ack_timeout_s, poll_s
        self._wanted: dict[str, WantedMember] = {}
        self._report: dict[str, MemberView] = {}
        self._version = 0  # bumped on every change to `_wanted`
        self._changed = threading.Condition()
        self.latency_totals: dict[str, tuple[float, float]] = {}  # the router's cumulative TTFT / TPOT (sum, count)

    # ---- the controller's side ------------------------------------------------
    def register(self, worker) -> None:
        entry = _entry(worker)
        self._change(lambda wanted: wanted.__setitem__(worker.name, entry))
        self._wait_for(lambda report: _holds(report, entry, draining=False), f"{worker.name} registered")

    def adopt(self, workers: list) -> None:
        """A restarted controller's first membership: the workers it found serving, as the router holds them.

        Does not wait for the router (it syncs only once the controller actor is up)."""
        entries = {worker.name: _entry(worker) for worker in workers}
        self._change(lambda wanted: wanted.update(entries))

    def drain(self, name: str) -> None:
        entry = self._wanted.get(name)
        if entry is None:
            return
        self._change(lambda wanted: wanted.__setitem__(name, replace(entry, draining=True)))
        self._wait_for(lambda report: _holds(report, entry, draining=True), f"{name} draining")

    def unregister(self, name: str) -> None:
        if name not in self._wanted:
            return
        self._change(lambda wanted: wanted.pop(name))
        self._wait_for(lambda report: name not in report, f"{name} unregistered")

    def snapshot(self) -> dict[str, MemberView]:
        """name -> the router's view of it (alive, draining, in_flight, its last load), from its last report."""
        with self._changed:
            return dict(self._report)

    # ---- the router's side ----------------------------------------------------
    def sync(self, report: MembershipReport) -> WantedMembership:
        """Take the router's report; reply with the wanted membership once it differs from the version the
        router knows (or after `poll_s`, so reports keep coming while nothing changes)."""
        with self._changed:
            self._report = {view.name: view for view in report.members}
            self.latency_totals = report.latency.as_dict()
            self._changed.notify_all()
            self._changed.wait_for(lambda: self._version != report.known_version, timeout=self.poll_s)
            return WantedMembership(self._version, tuple(self._wanted.values()))

    # ---- internals ------------------------------------------------------------
    def _change(self, edit) -> None:
        with self._changed:
            edit(self._wanted)
            self._version += 1
            self._changed.notify_all()

    def _wait_for(self, applied, what: str) -> bool:
        deadline = time.monotonic() + self.ack_timeout_s
        with self._changed:
            while not applied(self._report):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False  # the router stopped syncing (shutting down): nothing more to wait for
                self._changed.wait(left)
        return True


def _entry(worker) -> WantedMember:
    """`worker`: a `cluster.workers.PoolWorker` that serves (its control address learnt)."""
    return WantedMember(worker.name, worker.role, worker.actor_id, worker.control_address,
                        sender_key=worker.sender_key)  # fmt: skip


def _holds(report: dict[str, MemberView], entry: WantedMember, draining: bool) -> bool:
    view = report.get(entry.name)
    return view is not None and view.incarnation == entry.incarnation and view.draining == draining
