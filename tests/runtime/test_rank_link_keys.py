"""With a cluster key, a tensor-parallel worker's rank links admit only each other: a follower takes control
messages from rank 0's own key alone, rank 0 takes acks and reports from its followers' alone. Another member
holding the cluster key (a worker of another pool) can neither reserve a follower's blocks for its own KV
(`ExpectShard`), nor drop a transfer, nor forge an ack. Real sockets, keys as a deployment hands them out."""

from __future__ import annotations

import threading
import time

import pytest
import zmq

from runtime.rank_links import RankControl, RankLinks
from tests.kvtransfer.hostile import close_all, send_unless_refused, wait_refused
from wire.codec import encode
from wire.ranks import DropShard, ExpectShard, RankAck, RankEndpoint, TransferEnded
from wire.socket_security import ENV_VAR, ClusterKey, connect_secured, refusals, sender_keypair

KEY = ClusterKey.generate()
MEMBER = ClusterKey.generate()  # another member's own sender key (a worker of another pool)


@pytest.fixture(autouse=True)
def cluster_key(monkeypatch):
    monkeypatch.setenv(ENV_VAR, KEY.encoded())


def _member_pushes(address: str, sender: ClusterKey | None, msg) -> zmq.Socket:
    """A PUSH holding the cluster key (presenting `sender`'s key instead when given) that sends `msg`."""
    sock = zmq.Context.instance().socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 0)
    connect_secured(sock, address, key=KEY, sender=sender)
    send_unless_refused(sock, encode(msg))
    return sock


def _acking(control: RankControl, stop: threading.Event, seen: list) -> threading.Thread:
    """The follower's I/O thread: applies (records) and acks what rank 0 sends."""

    def run():
        while not stop.is_set():
            for msg in control.poll(5):
                seen.append(msg)
                control.ack(msg)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("sender", [None, MEMBER], ids=["cluster_key", "member_sender_key"])
def test_a_follower_takes_control_messages_from_its_rank_zero_only(sender):
    control = RankControl(1, leader_key=sender_keypair().public)  # rank 0 is this process
    before, seen, stop = refusals(), [], threading.Event()
    members = [_member_pushes(control.address, sender, msg)
               for msg in (ExpectShard("theirs", (0, 1, 2)), DropShard("ours", "forged"))]  # fmt: skip
    wait_refused(refusals, before, "rank_link", poll=lambda: seen.extend(control.poll(5)), reasons=("unauthenticated",))
    assert seen == []
    thread = _acking(control, stop, seen)
    links = RankLinks([RankEndpoint(1, control.address, sender_key=sender_keypair().public)], ack_timeout_s=20)
    links.tell(ExpectShard("ours", (3,)))
    deadline = time.monotonic() + 20
    while not any(isinstance(m, ExpectShard) for m in seen) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [m.request_id for m in seen if isinstance(m, ExpectShard)] == ["ours"]  # rank 0's, not the member's
    stop.set()
    thread.join()
    close_all(members)
    links.close()
    control.close()


def test_rank_zero_takes_acks_and_reports_from_its_followers_only():
    control = RankControl(1, leader_key=sender_keypair().public)
    stop, seen = threading.Event(), []
    thread = _acking(control, stop, seen)
    links = RankLinks([RankEndpoint(1, control.address, sender_key=sender_keypair().public)], ack_timeout_s=20)
    stop.set()
    thread.join()
    before = refusals()
    forged = [RankAck("ours", 1, "ExpectShard"), TransferEnded("ours", 1, "done")]
    members = [_member_pushes(links.address, MEMBER, msg) for msg in forged]
    read: list = []
    wait_refused(refusals, before, "rank_report", poll=lambda: read.extend(links.read()), reasons=("unauthenticated",))
    assert read == []
    control.report(TransferEnded("ours", 1, "done"))  # the follower's own report still arrives
    deadline = time.monotonic() + 20
    while not read and time.monotonic() < deadline:
        read.extend(links.read())
        time.sleep(0.01)
    assert read == [TransferEnded("ours", 1, "done")]
    close_all(members)
    links.close()
    control.close()


def test_a_rank_link_with_a_cluster_key_needs_the_other_sides_key():
    with pytest.raises(ValueError, match="sender key"):
        RankControl(1)
    with pytest.raises(ValueError, match="sender key"):
        RankLinks([RankEndpoint(1, "tcp://127.0.0.1:1")])
