"""The control channel between rank 0 of a tensor-parallel worker and its follower ranks' I/O threads.

    rank 0 (its step loop)                          follower rank r (its I/O thread)
    RankLinks(endpoints) ── ReportTo(our PULL) ───► RankControl: connects its PUSH there
                         ◄─────── RankAck ─────────
    call(ExpectShard | DropShard) ────────────────► applies it, then acks
        waits for every rank's RankAck (or raises RankTimeout)
    poll() ◄──────────────────── ShardEnded ─────── its part of a transfer ended

A follower's forward thread sits in the step broadcast, so its KV sender or
receiver lives on a thread of its own, reached through these typed ZMQ
PUSH/PULL messages (msgpack, never pickle). `call` waits for the acks so rank 0
knows the follower applied the message: after `ExpectShard`, no chunk can
arrive before its reservation; after `DropShard`, no write into the blocks is
in flight. Neither side is thread-safe: one thread drives each.
"""

from __future__ import annotations

import logging
import time

from kvtransfer.protocol import DropShard, ExpectShard, RankAck, RankEndpoint, ReportTo, ShardEnded
from kvtransfer.token_stream import PullSocket, Pushers

logger = logging.getLogger("tandem.kvtransfer")

CONTROL_MESSAGES = (ReportTo, ExpectShard, DropShard)


class RankTimeout(RuntimeError):
    """A follower rank did not acknowledge a control message in time (stuck or gone)."""


class RankLinks:
    """Rank 0's side: tell the followers, wait for their acks, collect their `ShardEnded` reports."""

    def __init__(self, endpoints: list[RankEndpoint], ack_timeout_s: float = 10.0, address: str = "tcp://127.0.0.1:0"):
        self.endpoints = {e.rank: e for e in endpoints}
        self.ack_timeout_s = ack_timeout_s
        self._pull = PullSocket((RankAck, ShardEnded), address, kind="rank_link")
        self._pushers = Pushers()
        self._reports: list[ShardEnded] = []  # arrived while waiting for acks
        self._acks: set[tuple[str, int, str]] = set()
        self.call(ReportTo(self._pull.address))

    @property
    def ranks(self) -> list[int]:
        return sorted(self.endpoints)

    def tell(self, msg) -> None:
        """Send `msg` to every follower without waiting."""
        for endpoint in self.endpoints.values():
            self._pushers.send(endpoint.control_address, msg)

    def call(self, msg) -> None:
        """Send `msg` to every follower and wait until each has applied it; raise `RankTimeout` if one has not."""
        self.tell(msg)
        request_id = getattr(msg, "request_id", "")
        wanted = {(request_id, rank, type(msg).__name__) for rank in self.endpoints}
        deadline = time.monotonic() + self.ack_timeout_s
        while not wanted <= self._acks:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                missing = sorted(rank for _, rank, _ in wanted - self._acks)
                self._acks -= wanted
                raise RankTimeout(
                    f"tensor-parallel rank(s) {missing} did not acknowledge {type(msg).__name__} "
                    f"{request_id!r} within {self.ack_timeout_s}s"
                )
            self._receive(min(left_ms, 100))
        self._acks -= wanted

    def drop(self, request_id: str, reason: str) -> None:
        """`DropShard` on every rank, waiting for the acks: then no rank reads or writes the request's
        blocks any more. A rank that does not answer is logged; the caller frees the blocks anyway."""
        try:
            self.call(DropShard(request_id, reason))
        except RankTimeout as err:
            logger.error("freeing the blocks of %s anyway: %s", request_id, err)

    def poll(self) -> list[ShardEnded]:
        """Reports that arrived since the last poll."""
        self._receive(0)
        reports, self._reports = self._reports, []
        return reports

    def close(self) -> None:
        self._pull.close()
        self._pushers.close()

    def _receive(self, timeout_ms: int) -> None:
        for msg in self._pull.poll(timeout_ms):
            if isinstance(msg, RankAck):
                self._acks.add((msg.request_id, msg.rank, msg.kind))
            else:
                self._reports.append(msg)


class RankControl:
    """A follower's side, on its I/O thread: read rank 0's control messages, push acks and reports."""

    def __init__(self, rank: int, address: str = "tcp://127.0.0.1:0"):
        self.rank = rank
        self._pull = PullSocket(CONTROL_MESSAGES, address, kind="rank_link")
        self.address = self._pull.address
        self._pushers = Pushers()
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

    def report(self, request_id: str, kind: str, peer: str = "", reason: str = "") -> None:
        self._push(ShardEnded(request_id, self.rank, kind, peer, reason))

    def close(self) -> None:
        self._pull.close()
        self._pushers.close()

    def _push(self, msg) -> None:
        if self._report_to:  # before ReportTo rank 0 has asked nothing of us
            self._pushers.send(self._report_to, msg)
