"""Faults a KV sender injects on purpose, for fault-injection tests (never set in production).

The sender builds every chunk as usual and then, instead of putting it on the
wire, drops it (the receiver's deadline fails the transfer) or holds it back
`delay_chunks_s` (past the receiver's deadline or the sender's lease: the
transfer fails first and the late chunks must be refused). Everything else
(handshake, heartbeats, leases, aborts) runs unchanged.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TransportFaults:
    drop_chunks: bool = False
    delay_chunks_s: float = 0.0

    @property
    def active(self) -> bool:
        return self.drop_chunks or self.delay_chunks_s > 0


@dataclass
class HeldChunks:
    """Chunks a delaying sender holds: (when due, send callable), oldest first."""

    faults: TransportFaults
    held: list = field(default_factory=list)

    def offer(self, send) -> None:
        """`send()` puts one chunk on the wire: now, later, or never, as the faults say."""
        if self.faults.drop_chunks:
            return
        if self.faults.delay_chunks_s > 0:
            self.held.append((time.monotonic() + self.faults.delay_chunks_s, send))
            return
        send()

    def release_due(self) -> None:
        now = time.monotonic()
        while self.held and self.held[0][0] <= now:
            self.held.pop(0)[1]()
