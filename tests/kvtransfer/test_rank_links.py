"""Rank 0 and a follower's I/O thread over the control channel: real ZMQ sockets on loopback, no engine."""

from __future__ import annotations

import threading

import pytest

from kvtransfer.codec import decode, encode
from kvtransfer.protocol import DropShard, ExpectShard, RankEndpoint, ShardEnded, ShardOrder, ShardOrders
from kvtransfer.protocol import DecodeReservation
from kvtransfer.rank_links import RankControl, RankLinks, RankTimeout


class _Follower:
    """A follower I/O loop on its own thread: applies ExpectShard/DropShard, reports ends."""

    def __init__(self, rank: int, answer: bool = True):
        self.control = RankControl(rank)
        self.applied: list = []
        self.answer = answer
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for msg in self.control.poll(5):
                self.applied.append(msg)
                if self.answer:
                    self.control.ack(msg)
                if isinstance(msg, ExpectShard):
                    self.control.report(msg.request_id, "done")
        self.control.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def test_call_returns_once_every_rank_applied_it_and_reports_come_back():
    followers = [_Follower(rank) for rank in (1, 2, 3)]
    links = RankLinks([RankEndpoint(f.control.rank, f.control.address) for f in followers], ack_timeout_s=10)
    try:
        links.call(ExpectShard("r1", (4, 5)))
        assert all(f.applied[-1] == ExpectShard("r1", (4, 5)) for f in followers)  # applied before call returned
        reports = []
        while len(reports) < 3:
            reports += links.poll()
        assert sorted(r.rank for r in reports) == [1, 2, 3]
        assert all(r == ShardEnded("r1", r.rank, "done") for r in reports)
        links.call(DropShard("r1", "client went away"))
    finally:
        links.close()
        for f in followers:
            f.stop()


def test_a_rank_that_does_not_acknowledge_times_out_naming_it():
    followers = [_Follower(1), _Follower(2, answer=False)]
    links = RankLinks([RankEndpoint(f.control.rank, f.control.address) for f in followers], ack_timeout_s=0.5)
    try:
        with pytest.raises(RankTimeout, match=r"rank\(s\) \[2\] did not acknowledge ExpectShard 'r1' within 0.5s"):
            links.call(ExpectShard("r1", (4,)))
    finally:
        links.close()
        for f in followers:
            f.stop()


def test_shard_orders_round_trip_as_a_step_attachment():
    res = DecodeReservation("r", False, "tcp://a:1", "tcp://i:2", (7, 8), 1, ("tcp://a:1", "tcp://b:3"), 2)
    orders = ShardOrders((ShardOrder("r", (3, 4), res),))
    assert decode(encode(orders), ShardOrders) == orders
    assert res.rank_addresses() == ("tcp://a:1", "tcp://b:3")
    assert DecodeReservation("r", False, "tcp://a:1").rank_addresses() == ("tcp://a:1",)  # TP=1 as before
