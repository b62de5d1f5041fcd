"""Rank 0 and a follower's I/O thread over the control channel: real ZMQ sockets on loopback, no engine."""

from __future__ import annotations

import threading

import pytest

from wire.codec import decode, encode
from wire.ranks import DropShard, ExpectShard, RankAck, RankEndpoint, TransferEnded, ShardOrder, ShardOrders
from wire.requests import DecodeReservation
from runtime.rank_links import RankControl, RankLinks, RankTimeout


class _Follower:
    """A follower I/O loop on its own thread: applies ExpectShard/DropShard, reports ends."""

    def __init__(self, rank: int):
        self.control = RankControl(rank)
        self.applied: list = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for msg in self.control.poll(5):
                self.applied.append(msg)
                self.control.ack(msg)
                if isinstance(msg, ExpectShard):
                    self.control.report(TransferEnded(msg.request_id, self.control.rank, "done"))
        self.control.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _read_until(links: RankLinks, count: int) -> list:
    got = []
    for _ in range(1000):
        if len(got) >= count:
            return got
        links.socket.poll(10)
        got += links.read()
    raise AssertionError(f"only {got} of {count} messages came")


def test_acks_and_reports_come_back_without_rank_0_waiting():
    followers = [_Follower(rank) for rank in (1, 2, 3)]
    links = RankLinks([RankEndpoint(f.control.rank, f.control.address) for f in followers], ack_timeout_s=10)
    try:
        links.tell(ExpectShard("r1", (4, 5)))  # returns at once
        got = _read_until(links, 6)
        acks = sorted((m.rank, m.kind) for m in got if isinstance(m, RankAck))
        assert acks == [(1, "ExpectShard"), (2, "ExpectShard"), (3, "ExpectShard")]
        reports = [m for m in got if isinstance(m, TransferEnded)]
        assert sorted(r.rank for r in reports) == [1, 2, 3]
        assert all(r == TransferEnded("r1", r.rank, "done") for r in reports)
        assert all(f.applied[-1] == ExpectShard("r1", (4, 5)) for f in followers)
        links.tell(DropShard("r1", "client went away"))
        assert sorted(m.kind for m in _read_until(links, 3)) == ["DropShard"] * 3
    finally:
        links.close()
        for f in followers:
            f.stop()


def test_a_rank_that_does_not_answer_at_start_up_times_out_naming_it():
    follower, stuck = _Follower(1), RankControl(2)  # rank 2's I/O thread never reads its socket
    try:
        with pytest.raises(RankTimeout, match=r"rank\(s\) \[2\] did not acknowledge ReportTo within 0.5s"):
            RankLinks([RankEndpoint(1, follower.control.address), RankEndpoint(2, stuck.address)], ack_timeout_s=0.5)
    finally:
        follower.stop()
        stuck.close()


def test_shard_orders_round_trip_as_a_step_attachment():
    res = DecodeReservation("r", False, "tcp://a:1", "tcp://i:2", (7, 8), 1, ("tcp://a:1", "tcp://b:3"), 2)
    orders = ShardOrders((ShardOrder("r", (3, 4), res),))
    assert decode(encode(orders), ShardOrders) == orders
    assert res.rank_addresses() == ("tcp://a:1", "tcp://b:3")
    assert DecodeReservation("r", False, "tcp://a:1").rank_addresses() == ("tcp://a:1",)  # TP=1 as before
