"""The decode side of the KV handoff on a worker's I/O thread: a `KVReceiver` and the commands that drive it.

    loop thread ── ExpectKV(request, block ids) ──► receiver.recv        (before the reserve is answered)
                ── Release(request, reason) ──────► receiver.abort, then Released back:
                                                    from then on nothing writes the request's blocks
                ── AnswerAfter(answer, result) ───► answer(result) here, after the commands before it
    loop thread ◄── TransferEnded(request, rank, done | failed, reason) ── the receiver's events

The same service runs on rank 0 (events go to its loop) and on a tensor-parallel
follower (its events go on to rank 0, `decode_worker.follower`).
Chunks land while the loop thread runs other requests' steps: no running
request's block table points at reserved blocks.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

from kvtransfer.receiver import KVReceiver
from runtime.transfer_service import TransferService
from wire.ranks import TransferEnded

logger = logging.getLogger("tandem.decode")


@dataclass(frozen=True)
class ExpectKV:
    request_id: str
    block_ids: tuple[int, ...]
    transfer_token: str = field(default="", repr=False)  # the reservation's: chunks without it are refused


@dataclass(frozen=True)
class AnswerAfter:
    """Answer a call from the I/O thread, once every command posted before this one has run."""

    answer: Callable
    result: object


class KVReceiving(TransferService):
    def __init__(self, receiver: KVReceiver, report: Callable[[object], None], rank: int = 0):
        super().__init__(receiver, report, rank)
        self.receiver = receiver

    def commands(self) -> dict[type, Callable]:
        return {**super().commands(), ExpectKV: self.expect, AnswerAfter: lambda cmd: cmd.answer(cmd.result)}

    def expect(self, cmd: ExpectKV) -> None:
        try:
            self.receiver.recv(cmd.request_id, cmd.block_ids, cmd.transfer_token)
        except ValueError as err:  # the id is still in use by an earlier transfer: a router bug, fail this one
            logger.error("cannot expect the KV of %s: %s", cmd.request_id, err)
            self.report(TransferEnded(cmd.request_id, self.rank, "failed", reason=str(err)))

    def counters(self) -> dict:
        """The heartbeat's KV figures (read from other threads: plain ints and floats)."""
        stats = self.receiver.stats
        return {"kv_transfers": stats.transfers_completed, "kv_transfer_bytes": stats.transfer_bytes,
                "kv_transfer_seconds": stats.transfer_seconds}  # fmt: skip
