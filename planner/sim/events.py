"""Simulated time: a queue of callbacks ordered by when they happen (ties in the order they were queued)."""

from __future__ import annotations

import heapq
import itertools
from typing import Callable


class EventQueue:
    def __init__(self):
        self.now = 0.0
        self.events = 0  # callbacks run so far
        self._heap: list = []
        self._order = itertools.count()
        self._stopped = False

    def at(self, when: float, callback: Callable, *args) -> None:
        """Run `callback(*args)` at `when` (never in the past: a late time means now)."""
        heapq.heappush(self._heap, (max(when, self.now), next(self._order), callback, args))

    def after(self, delay: float, callback: Callable, *args) -> None:
        self.at(self.now + delay, callback, *args)

    def stop(self) -> None:
        """End `run` after the callback now running."""
        self._stopped = True

    def run(self, until: float = float("inf")) -> None:
        """Run callbacks in time order until `until`, no callback is left, or one calls `stop`."""
        self._stopped = False
        while self._heap and not self._stopped and self._heap[0][0] <= until:
            when, _, callback, args = heapq.heappop(self._heap)
            self.now = when
            callback(*args)
            self.events += 1
