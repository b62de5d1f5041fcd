"""Leases: a holder keeps something only while its peer keeps renewing it.

The sender holds a request's source blocks under a lease that the receiver's
heartbeats renew; when the heartbeats stop (receiver dead, or it forgot the
request) the lease expires and the caller may free the blocks. The clock is
injected so the logic is testable without sleeping.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable

Clock = Callable[[], float]


class LeaseTable:
    def __init__(self, duration_s: float, clock: Clock = time.monotonic):
        if duration_s <= 0:
            raise ValueError(f"lease duration must be > 0, got {duration_s}")
        self.duration_s = duration_s
        self.clock = clock
        self._deadlines: dict[Hashable, float] = {}

    def grant(self, key: Hashable) -> None:
        self._deadlines[key] = self.clock() + self.duration_s

    def renew(self, key: Hashable) -> bool:
        """Extend a live lease; False if there is none (expired leases stay expired)."""
        if key not in self._deadlines:
            return False
        self._deadlines[key] = self.clock() + self.duration_s
        return True

    def release(self, key: Hashable) -> None:
        self._deadlines.pop(key, None)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._deadlines

    def pop_expired(self) -> list[Hashable]:
        """Leases past their deadline, removed from the table."""
        now = self.clock()
        expired = [key for key, deadline in self._deadlines.items() if deadline <= now]
        for key in expired:
            del self._deadlines[key]
        return expired
