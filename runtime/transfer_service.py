"""What the two roles' KV services on a worker's I/O thread share (`prefill_worker.kv_sending`,
`decode_worker.kv_receiving`): an endpoint, a `KVSender` or a `KVReceiver`, whose sockets and next deadline
the I/O thread polls; its ended transfers reported as `TransferEnded`; and the release of a request's
transfers (`Release`), acknowledged with `Released` once nothing reads or writes its blocks any more.

The endpoint belongs to the service: it is closed with it, on the I/O thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from runtime.io_thread import IOService
from wire.ranks import TransferEnded


@dataclass(frozen=True)
class Release:
    request_id: str
    reason: str


@dataclass(frozen=True)
class Released:
    """`request_id`'s transfers on `rank` are released: from then on nothing touches its blocks there."""

    request_id: str
    rank: int = 0


class TransferService(IOService):
    def __init__(self, endpoint, report: Callable[[object], None], rank: int):
        self.endpoint, self.report, self.rank = endpoint, report, rank

    def commands(self) -> dict[type, Callable]:
        return {Release: self.release}

    def release(self, cmd: Release) -> None:
        self.endpoint.abort(cmd.request_id, cmd.reason)  # a no-op once its transfers ended
        self.report(Released(cmd.request_id, self.rank))

    def sockets(self) -> list:
        return self.endpoint.sockets()

    def next_deadline(self) -> float | None:
        return self.endpoint.next_deadline()

    def service(self) -> None:
        for e in self.endpoint.poll(0):
            self.report(TransferEnded(e.request_id, self.rank, e.kind, e.peer, e.reason))

    def close(self) -> None:
        self.endpoint.close()
