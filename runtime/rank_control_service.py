"""A tensor-parallel follower's side of the rank links, on its I/O thread: apply rank 0's messages, then ack.

    rank 0 ── ExpectShard / DropShard ──► RankControl PULL ──► handler (this rank's receiver or sender)
    rank 0 ◄── RankAck ── once the handler returned (applied)

Before a message is applied, the commands this rank's forward thread queued
earlier (the transfers of a step it ran) are run: a drop never overtakes the
order it drops. The follower's KV service reports through `report`: a
transfer's end goes to rank 0 (`TransferEnded`), a release stays here.
"""

from __future__ import annotations

from typing import Callable

from runtime.rank_links import RankControl
from runtime.io_thread import IOService, IOThread
from wire.ranks import TransferEnded


class RankControlService(IOService):
    def __init__(self, control: RankControl, io: IOThread, handlers: dict[type, Callable]):
        self.control, self.io, self.handlers = control, io, handlers

    def report(self, event) -> None:
        if isinstance(event, TransferEnded):  # a release is acknowledged by the DropShard's ack instead
            self.control.report(event)

    def sockets(self) -> list:
        return [self.control.socket]

    def service(self) -> None:
        for msg in self.control.poll(0):
            self.io.run_pending()
            self.handlers[type(msg)](msg)
            self.control.ack(msg)

    def close(self) -> None:
        self.control.close()
