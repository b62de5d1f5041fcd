"""What both roles' loop workers share: one record per request, moved only by a transition table.

A role's worker keeps `records` (request id -> its record, which has a `phase`)
and a class-level `transitions` table, (phase, event) -> the name `n` of its
method `_to_n(record, event, **facts)`. `on(request_id, event, ...)` is the
only way a record changes phase: an event its phase does not list is late news
(a KV chunk after an abort, a transfer's end after a failure) and is ignored,
so every failure path is one table entry. Calls from the router or a lifecycle
caller arrive as `Call`s and go to the method their name says (`calls`).
A worker holds its requests for the router under a `lease` (`runtime.router_lease`):
when the router stops calling, every record gets the role's `abort_event`.
"""

from __future__ import annotations

from typing import Callable

from runtime.control_service import Call
from runtime.load_board import LoopSnapshot
from runtime.router_lease import RouterLease


class RequestTable:
    transitions: dict = {}  # (phase, event) -> transition name (a role's records module)
    abort_event = None  # the role's event that ends a record on the router's behalf
    lease: RouterLease  # set by the role's worker

    def __init__(self):
        self.records: dict = {}  # insertion order: oldest first
        self.calls: dict[str, Callable[[Call], None]] = {"is_clean": self.is_clean}

    def on(self, request_id: str, event, reason: str = "", **facts) -> None:
        record = self.records.get(request_id)
        name = self.transitions.get((record.phase, event)) if record is not None else None
        if name is not None:  # else late news for a phase that no longer cares
            getattr(self, f"_to_{name}")(record, event, reason=reason, **facts)

    def take_call(self, call: Call) -> None:
        try:
            self.calls[call.method](call)
        except Exception as err:  # ValueError: the caller's fault; anything else a bug the caller hears of
            call.answer(None, err)

    def next_deadline(self) -> float | None:
        return self.lease.next_deadline(self.records.values())

    def end_all_if_router_gone(self, now: float) -> None:
        """The router has not called for the lease's length: nobody waits for what we hold."""
        if self.records and self.lease.expired(now):
            for request_id in list(self.records):
                self.on(request_id, self.abort_event, self.lease.reason)

    def is_clean(self, call: Call) -> None:
        snap = self.snapshot()
        call.answer(snap.idle and snap.pool_all_free)

    def snapshot(self) -> LoopSnapshot:
        raise NotImplementedError
