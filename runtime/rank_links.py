"""The control channel between rank 0 of a tensor-parallel worker and its follower ranks' I/O threads.

    rank 0 (its loop thread)                        follower rank r (its I/O thread)
    RankLinks(endpoints) ── ReportTo(our PULL) ───► RankControl: connects its PUSH there
                         ◄─────── RankAck ─────────   (start-up: waited for)
    tell(ExpectShard | DropShard) ────────────────► applies it, then acks
    read() ◄──────────────── RankAck | TransferEnded ── applied / its part of a transfer ended

A follower's forward thread sits in the step broadcast, so its KV sender or
receiver lives on a thread of its own, reached through these typed ZMQ
PUSH/PULL messages (msgpack, never pickle). Rank 0 keeps track of the acks
(per request, `decode_worker.records`): once a follower acked `ExpectShard`,
no chunk can arrive before its reservation; once it acked `DropShard`, no
write into (or read of) the blocks is in flight there. Neither side is
thread-safe: one thread drives each.

With a cluster key, each side sends with its process's own key and admits only the other's: a
follower only rank 0's (given to it at start-up, `leader_key`), rank 0 only its followers' (their
`RankEndpoint.sender_key`). Another member holding the cluster key cannot reserve a shard's blocks
for its own writes, drop a transfer, or forge a follower's ack.
"""

from __future__ import annotations

import logging
import time

from wire.ranks import DropShard, ExpectShard, RankAck, RankEndpoint, ReportTo, TransferEnded
from wire.push_pull import PullSocket, Pushers
from wire.socket_security import only, process_key

logger = logging.getLogger("tandem.runtime")

CONTROL_MESSAGES = (ReportTo, ExpectShard, DropShard)


class RankTimeout(RuntimeError):
    """A follower rank did not acknowledge a control message in time (stuck or gone)."""


class _Link:
    """Either side's sockets: the PULL it reads (`socket`, for its thread's poller), admitting only the
    `peers` keys (with a cluster key), and the PUSHes it sends on, with this process's own key."""

    def __init__(self, kinds: tuple, address: str, kind: str, peers: set[str]):
        if process_key() is not None and not all(peers):
            raise ValueError(f"a {kind} socket with a cluster key needs the other side's sender key")
        self._pull = PullSocket(kinds, address, kind=kind, senders=only(peers, kind))  # (no cluster key: unused)
        self._pushers = Pushers(signed=True)

    @property
    def socket(self):
        return self._pull.socket

    @property
    def address(self) -> str:
        """Where its PULL listens (rank 0's: where its followers report)."""
        return self._pull.address

    def close(self) -> None:
        self._pull.close()
        self._pushers.close()


class RankLinks(_Link):
    """Rank 0's side, on its loop thread: tell the followers, read their acks and reports as they come.

    Only the first exchange (`ReportTo`, at start-up) is waited for; afterwards rank 0 never
    blocks on a follower: it keeps what it waits for as state and reads `RankAck`s and
    `TransferEnded` reports from `read()` when `socket` is readable."""

    def __init__(self, endpoints: list[RankEndpoint], ack_timeout_s: float = 10.0, address: str = "tcp://127.0.0.1:0"):
        super().__init__((RankAck, TransferEnded), address, "rank_report", {e.sender_key for e in endpoints})
        self.endpoints = {e.rank: e for e in endpoints}
        self.ack_timeout_s = ack_timeout_s
        self._connect()

    @property
    def ranks(self) -> list[int]:
        return sorted(self.endpoints)

    def tell(self, msg) -> None:
        """Send `msg` to every follower without waiting (each acks it with a `RankAck` once applied)."""
        for endpoint in self.endpoints.values():
            self._pushers.send(endpoint.control_address, msg)

    def read(self) -> list[RankAck | TransferEnded]:
        """Acks and reports that arrived since the last read."""
        return self._pull.poll(0)

    def _connect(self) -> None:
        """Tell every follower where to report; wait (start-up only) until each has, or raise `RankTimeout`."""
        self.tell(ReportTo(self._pull.address))
        missing, deadline = set(self.endpoints), time.monotonic() + self.ack_timeout_s
        while missing:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                raise RankTimeout(f"tensor-parallel rank(s) {sorted(missing)} did not acknowledge ReportTo "
                                  f"within {self.ack_timeout_s}s")  # fmt: skip
            for msg in self._pull.poll(min(left_ms, 100)):
                if isinstance(msg, RankAck) and msg.kind == "ReportTo":
                    missing.discard(msg.rank)


class RankControl(_Link):
    """A follower's side, on its I/O thread: read rank 0's control messages (only from `leader_key`, rank 0's
    sender key, with a cluster key), push acks and reports."""

    def __init__(self, rank: int, address: str = "tcp://127.0.0.1:0", leader_key: str = ""):
        super().__init__(CONTROL_MESSAGES, address, "rank_link", {leader_key})
        self.rank = rank
        self._report_to = ""

    def poll(self, timeout_ms: int = 0) -> list:
        """Control messages for the caller (ExpectShard, DropShard); it acks each with `ack` once applied."""
        out = []
        for msg in self._pull.poll(timeout_ms):
            if isinstance(msg, ReportTo):
                self._report_to = msg.address
                self.ack(msg)
            else:
                out.append(msg)
        return out

    def ack(self, msg) -> None:
        self._push(RankAck(getattr(msg, "request_id", ""), self.rank, type(msg).__name__))

    def report(self, ended: TransferEnded) -> None:
        self._push(ended)

    def _push(self, msg) -> None:
        if self._report_to:  # before ReportTo rank 0 has asked nothing of us
            self._pushers.send(self._report_to, msg)
