"""Inside one tensor-parallel worker: rank 0 and its follower ranks' I/O threads (`runtime.rank_links`).

    rank 0 ── ReportTo | ExpectShard | DropShard ──► follower control PULL   (acked: RankAck)
    rank 0 ◄── RankAck | TransferEnded ── follower                            (ZMQ PUSH/PULL)
    prefill rank 0 ── ShardOrders ──► followers, attached to the step broadcast (`wire.step`)
"""

from __future__ import annotations

from dataclasses import field

from wire.codec import message
from wire.requests import DecodeReservation


@message
class RankEndpoint:
    """Where a follower rank listens: its control socket, and (decode) its KV receiver."""

    rank: int
    control_address: str
    kv_address: str = ""
    sender_key: str = ""  # the public key its acks and reports come with: rank 0's PULL admits only it


@message
class ReportTo:
    """Rank 0 to a follower, first: push your acks and reports to this address."""

    address: str


@message
class ExpectShard:
    """Decode rank 0 to a follower: expect the request's KV (your heads) into these block ids."""

    request_id: str
    block_ids: tuple[int, ...]
    transfer_token: str = field(default="", repr=False)  # the reservation's: chunks without it are refused


@message
class DropShard:
    """Rank 0 to a follower: stop receiving (decode) or sending (prefill) the request's KV shard."""

    request_id: str
    reason: str


@message
class RankAck:
    """A follower has applied rank 0's `kind` message (ReportTo, ExpectShard, DropShard) for the request."""

    request_id: str
    rank: int
    kind: str


@message
class TransferEnded:
    """One rank's part of a request's KV transfer ended: received all its heads (decode), or sent them to `peer`
    (prefill). The one report of it: from a rank's I/O thread to its worker's loop, and from a follower rank
    to rank 0."""

    request_id: str
    rank: int
    kind: str  # "done", "failed" or "expired" (kvtransfer.connector.TransferEvent kinds)
    peer: str = ""  # the other end: prefill, the decode receiver's address ("" if it never started); decode, the sender
    reason: str = ""

    @property
    def done(self) -> bool:
        return self.kind == "done"


@message
class ShardOrder:
    """One request whose KV a prefill forward completes: each prefill rank sends its pieces of it."""

    request_id: str
    src_block_ids: tuple[int, ...]
    reservation: DecodeReservation


@message
class ShardOrders:
    orders: tuple[ShardOrder, ...]
