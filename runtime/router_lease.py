"""A worker holds requests only while its router keeps calling; and the timers of its request records.

Every call from the router renews the lease (the control socket notes it on the
load board, and the router's load polls come every half second); when none has
come for `lease_s` the router is gone and nobody waits for what the worker
holds, so it ends every request and frees their blocks. Records (decode or
prefill) each carry an optional `deadline` (monotonic seconds) for their own
timers; the loop wakes for the earliest.
"""

from __future__ import annotations

from typing import Iterable

from runtime.load_board import LoadBoard


class RouterLease:
    def __init__(self, board: LoadBoard, lease_s: float):
        self.board, self.lease_s = board, lease_s

    @property
    def reason(self) -> str:
        return f"no call from the router for {self.lease_s}s"

    def expired(self, now: float) -> bool:
        return now - self.board.router_last_seen > self.lease_s

    def next_deadline(self, records: Iterable) -> float | None:
        """The earliest record deadline and, while any request is held, the lease's end."""
        records = list(records)
        deadlines = [r.deadline for r in records if r.deadline is not None]
        if records:
            deadlines.append(self.board.router_last_seen + self.lease_s)
        return min(deadlines, default=None)


def due(records: Iterable, now: float) -> list:
    """The records whose own deadline has passed."""
    return [r for r in records if r.deadline is not None and r.deadline <= now]
