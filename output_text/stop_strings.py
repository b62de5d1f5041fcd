"""Stop strings over a growing text: the first one to appear, and how much of the tail may still begin one.

Owned by `output_text.stream.TextStream`, which feeds it the text as it grows; it keeps no text itself.
"""

from __future__ import annotations


class StopStrings:
    def __init__(self, stops: tuple[str, ...]):
        self.stops = stops
        self._longest = max((len(s) for s in stops), default=0)

    def first_match(self, text: str, searched: int, floor: int) -> tuple[int, str] | None:
        """(index, stop string) of the earliest match in `text` that starts at or after `floor`, or None.

        `text[:searched]` held no match before, so only a match ending past it can be new: the search
        starts where such a match could begin, and each token costs the length of its piece, not the text's.
        Among stop strings found at the same index, the first listed wins."""
        start = max(floor, searched - self._longest + 1)
        hits = [(i, s) for s in self.stops if (i := text.find(s, start)) != -1]
        return min(hits, key=lambda hit: hit[0]) if hits else None

    def partial_tail(self, text: str, floor: int) -> int:
        """Length of the longest tail of `text` (after `floor`) that begins a stop string.

        That tail may yet become a stop string with the next token, so it is not shown until decided."""
        for length in range(min(self._longest - 1, len(text) - floor), 0, -1):
            tail = text[-length:]
            if any(s.startswith(tail) for s in self.stops):
                return length
        return 0
