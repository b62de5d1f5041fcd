"""Each internal socket kind under hostile traffic (tests/kvtransfer/hostile.py), on loopback with a cluster key:
every attack is refused and counted, nothing reaches the caller, and real traffic still flows afterwards."""

from __future__ import annotations

import asyncio
import threading

import pytest
import zmq

from kvtransfer import KVReceiver, KVSender, PeerTarget
from wire.ranks import RankEndpoint
from wire.requests import FirstToken, PrefillFailed, TokenDelta
from runtime.rank_links import RankControl, RankLinks
from wire.socket_security import ENV_VAR, SMALL_MESSAGE_BYTES, ClusterKey, bind_secured, refusals, sender_keypair
from wire.push_pull import PullSocket, Pushers
from router.token_stream import TokenStreamConsumer
from tests.kvtransfer.hostile import close_all, delta, send_hostile, wait_refused
from tests.kvtransfer.peers import SPEC, random_caches, same_bits, serving, zero_caches

KEY = ClusterKey.generate()
INSIDER = ClusterKey.generate()  # a worker's own sender key
OVERSIZED = SMALL_MESSAGE_BYTES + 1


@pytest.fixture(autouse=True)
def cluster_key(monkeypatch):
    """This process is a cluster member: its sockets take the key from the environment, as workers do."""
    monkeypatch.setenv(ENV_VAR, KEY.encoded())


def _oversized_never_read(before: dict, kind: str) -> None:
    """Only the one undecodable message was read: the oversized frame (zeros, undecodable too) never
    reached the receive loop, libzmq dropped it at the size limit."""
    assert delta(refusals(), before, kind)["malformed"] == 1


def test_inbox_refuses_and_counts_every_attack_then_takes_a_first_token():
    inbox = PullSocket((FirstToken, PrefillFailed), kind="inbox")
    before, delivered = refusals(), []
    clients = send_hostile(inbox.address, KEY, OVERSIZED)
    wait_refused(refusals, before, "inbox", poll=lambda: delivered.extend(inbox.poll(5)))
    assert delivered == []
    pushers = Pushers()
    pushers.send(inbox.address, FirstToken("r1", 42))
    while not delivered:
        delivered.extend(inbox.poll(50))
    _oversized_never_read(before, "inbox")
    assert delivered == [FirstToken("r1", 42)]
    close_all(clients)
    pushers.close()
    inbox.close()


def test_rank_link_refuses_and_counts_every_attack_then_rank_zero_still_reaches_the_follower():
    control = RankControl(1, leader_key=sender_keypair().public)  # rank 0 is this process
    before, delivered = refusals(), []
    clients = send_hostile(control.address, KEY, OVERSIZED, insider=sender_keypair())  # garbage from rank 0's key
    wait_refused(refusals, before, "rank_link", poll=lambda: delivered.extend(control.poll(5)))
    assert delivered == []
    stop = threading.Event()

    def follower():  # acks what rank 0 sends (RankLinks' constructor waits for the ReportTo ack)
        while not stop.is_set():
            for msg in control.poll(5):
                control.ack(msg)

    thread = threading.Thread(target=follower, daemon=True)
    thread.start()
    links = RankLinks([RankEndpoint(1, control.address, sender_key=sender_keypair().public)], ack_timeout_s=20)
    _oversized_never_read(before, "rank_link")
    links.close()
    stop.set()
    thread.join()
    close_all(clients)
    control.close()


def test_kv_receiver_refuses_and_counts_every_attack_then_a_transfer_lands():
    caches = zero_caches(SPEC, 4)
    receiver = KVReceiver(caches, SPEC, "tcp://127.0.0.1:0")
    before = refusals()
    clients = send_hostile(receiver.address, KEY, OVERSIZED, zmq.DEALER)
    wait_refused(refusals, before, "kv", poll=lambda: receiver.poll(5))
    assert all(not t.any() for kv in caches for t in kv)
    receiver.recv("r", [0, 1])
    sender, src = KVSender(SPEC, "p0"), random_caches(SPEC, 4, seed=3)
    with serving(receiver) as events:
        sender.send("r", [2, 3], PeerTarget(receiver.address, (0, 1)))
        for layer in range(SPEC.num_layers):
            sender.send_layer("r", layer, *src[layer])
        while not events:
            sender.poll(10)
    assert [e.kind for e in events] == ["done"]
    _oversized_never_read(before, "kv")
    assert all(same_bits(k[0:2], ks[2:4]) and same_bits(v[0:2], vs[2:4]) for (k, v), (ks, vs) in zip(caches, src))
    close_all(clients)
    sender.close()
    receiver.close()


def test_router_token_stream_refuses_and_counts_every_attack_then_streams_a_request():
    async def run():
        # The stream admits registered workers' own keys only: the insider is one, and so is this process.
        registered = {INSIDER.public: "decode-1", sender_keypair().public: "decode-0"}
        stream = TokenStreamConsumer(key=KEY, senders=registered.get)
        await stream.start()
        outputs = stream.open("r1")
        before = refusals()
        clients = send_hostile(stream.address, KEY, OVERSIZED, insider=INSIDER)
        await asyncio.to_thread(wait_refused, refusals, before, "token_stream")  # the reader runs meanwhile
        pushers = Pushers()
        pushers.send(stream.address, TokenDelta("r1", 0, (5, 6), True, "length", 3, 2))
        chunks = [chunk async for chunk in outputs.chunks()]
        assert [c.token_ids for c in chunks] == [[5, 6]] and chunks[-1].final is not None
        _oversized_never_read(before, "token_stream")
        close_all(clients)
        pushers.close()
        await stream.close()

    asyncio.run(asyncio.wait_for(run(), 60))


@pytest.mark.parametrize("address", ["tcp://0.0.0.0:0", "tcp://*:0", "tcp://[::]:0"])
def test_internal_sockets_never_bind_a_wildcard(address):
    sock = zmq.Context.instance().socket(zmq.PULL)
    with pytest.raises(ValueError, match="one interface"):
        bind_secured(sock, address, "inbox")
    sock.close()


def test_a_cluster_key_travels_as_text():
    assert ClusterKey.parse(KEY.encoded()) == KEY and KEY.secret not in repr(KEY)
    with pytest.raises(ValueError):
        ClusterKey.parse("not-a-key")
