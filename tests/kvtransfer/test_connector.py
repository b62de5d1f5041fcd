"""Sender and receiver over real loopback sockets in one process: re-sharding, leases, aborts, bad input."""

from __future__ import annotations

import itertools

import pytest
import zmq

from kvtransfer import KVReceiver, KVSender, KVSpec, PeerTarget, TransferTimeouts
from wire.codec import encode
from wire.kv import PROTOCOL_VERSION, Abort, Hello, KVChunk, Refused, Welcome, compat_hash
from wire.socket_security import refusals
from kvtransfer.resharding import pieces_from, rank_heads, shard_heads
from kvtransfer.zmq_transport import connect_dealer, decode_header, send_message
from tests.kvtransfer.peers import poll_until_event, random_caches, same_bits, serving, zero_caches

SPEC = KVSpec("tiny-test", "float32", block_size=4, num_layers=2, num_kv_heads=2, head_dim=8)
LOOPBACK = "tcp://127.0.0.1:0"


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("src_tp,dst_tp", list(itertools.product((1, 2, 4), (1, 2, 4))))
def test_resharding_through_the_connector(src_tp, dst_tp):
    heads = SPEC.num_kv_heads  # 2 heads: TP=4 replicates each on two ranks
    full = random_caches(SPEC, 8, seed=3)
    receivers = [
        KVReceiver(zero_caches(SPEC, 8, len(rank_heads(heads, dst_tp, r))), SPEC, LOOPBACK, tp_size=dst_tp, tp_rank=r)
        for r in range(dst_tp)
    ]
    for receiver in receivers:
        receiver.recv("r", [5, 6, 0])
    with serving(*receivers) as events:
        senders = []
        for src_rank in range(src_tp):
            sender = KVSender(SPEC, f"p{src_rank}", tp_size=src_tp, tp_rank=src_rank)
            shard = [(shard_heads(k, heads, src_tp, src_rank).contiguous(),
                      shard_heads(v, heads, src_tp, src_rank).contiguous()) for k, v in full]  # fmt: skip
            pieces = pieces_from(heads, src_tp, src_rank, dst_tp)
            for piece in pieces:
                sender.send("r", [1, 2, 7], PeerTarget.from_piece(piece, receivers[piece.dst_rank].address, [5, 6, 0]))
            for layer in range(SPEC.num_layers):
                sender.send_layer("r", layer, *shard[layer])
            senders.append((sender, len(pieces)))
        # A receiver fed by several senders says done to each once all of them have sent (each sender
        # completes its handshake, and so sends its layers, only as it is polled: poll them all in turn).
        done = {sender: [] for sender, _ in senders}
        for _ in range(2000):
            if all(len(done[sender]) >= n for sender, n in senders):
                break
            for sender, _ in senders:
                done[sender] += sender.poll(2)
        for sender, num_pieces in senders:
            assert [e.kind for e in done[sender]] == ["done"] * num_pieces
            sender.close()
    assert sorted(e.kind for e in events) == ["done"] * dst_tp
    for r, receiver in enumerate(receivers):
        for (k, v), (k_ref, v_ref) in zip(receiver.kv_caches, full):
            assert same_bits(k[[5, 6, 0]], shard_heads(k_ref, heads, dst_tp, r)[[1, 2, 7]])
            assert same_bits(v[[5, 6, 0]], shard_heads(v_ref, heads, dst_tp, r)[[1, 2, 7]])
        receiver.close()


def test_heartbeats_renew_the_lease_until_they_stop():
    clock = FakeClock()
    timeouts = TransferTimeouts(heartbeat_interval_s=1.0, lease_s=10.0, peer_silence_s=100.0)
    receiver = KVReceiver(zero_caches(SPEC, 4), SPEC, LOOPBACK, timeouts=timeouts, clock=clock)
    receiver.recv("r", [0, 1])
    sender = KVSender(SPEC, "p0", timeouts=timeouts, clock=clock)
    with serving(receiver):
        sender.send("r", [2, 3], PeerTarget(receiver.address, (0, 1)))
    for _ in range(3):  # 18 s in all, past the 10 s lease, renewed by each heartbeat
        clock.now += 6.0
        receiver.poll(0)  # heartbeat listing "r"
        assert sender.poll(1000) == []
    assert sender.pending() == [("r", receiver.address)]
    clock.now += 10.0  # the receiver stops polling: no more heartbeats
    # Each poll above returned on the first message queued, so the last heartbeat may still be on its
    # way (on a loaded machine it was): handled now, it renews the lease once more, and only then does
    # the silence expire it. With nothing in flight this poll waits its second and expires the lease.
    events = sender.poll(1000)
    if not events:
        clock.now += 10.0
        events = sender.poll(0)
    (event,) = events
    assert (event.kind, event.request_id) == ("expired", "r")


def test_receiver_times_out_a_transfer_that_never_comes():
    clock = FakeClock()
    receiver = KVReceiver(zero_caches(SPEC, 4), SPEC, LOOPBACK, timeouts=TransferTimeouts(transfer_s=30.0), clock=clock)
    receiver.recv("r", [0, 1])
    assert receiver.poll(0) == []
    clock.now += 31.0
    (event,) = receiver.poll(0)
    assert (event.kind, event.request_id) == ("failed", "r") and "timed out" in event.reason


def test_aborts_travel_both_ways():
    receiver = KVReceiver(zero_caches(SPEC, 4), SPEC, LOOPBACK)
    receiver.recv("from-sender", [0])
    receiver.recv("from-receiver", [1])
    sender = KVSender(SPEC, "p0")
    caches = random_caches(SPEC, 4, seed=0)
    with serving(receiver) as events:
        sender.send("from-sender", [2], PeerTarget(receiver.address, (0,)))
        sender.send("from-receiver", [3], PeerTarget(receiver.address, (1,)))
        sender.send_layer("from-receiver", 0, *caches[0])  # the receiver now knows this sender fills it
        sender.abort("from-sender", "client went away")
        while not events:
            sender.poll(10)
    assert [(e.request_id, e.kind) for e in events] == [("from-sender", "failed")]
    assert "client went away" in events[0].reason
    receiver.abort("from-receiver", "decode worker draining")
    (event,) = poll_until_event(sender, 400, 10)
    assert (event.request_id, event.kind) == ("from-receiver", "failed") and "draining" in event.reason
    assert sender.pending() == [] and receiver.pending() == []


def _raw_sender(receiver) -> zmq.Socket:
    """A bare DEALER that passes the handshake, to send hand-made (bad) chunks."""
    sock = connect_dealer(zmq.Context.instance(), receiver.address, send_timeout_ms=5000)
    send_message(sock, Hello(PROTOCOL_VERSION, compat_hash(SPEC), SPEC, 1, 0, "raw", "zmq"))
    while not sock.poll(10):
        receiver.poll(10)
    assert isinstance(decode_header(sock.recv_multipart(copy=False)[0]), Welcome)
    return sock


@pytest.mark.parametrize(
    "runs,gathered,frame_bytes,problem",
    [
        (((0, 2),), False, [512, 511], "frame of 511 bytes"),  # truncated V frame
        (((0, 2),), False, [512], "1 frames for 1 runs"),  # a frame missing
        (((0, 3),), False, [768, 768], "not reserved"),  # spills into a block that is not ours
        (((2, 2**40),), False, [512, 512], "outside our 4"),  # absurd run: refused before any allocation
        (((1, 1), (0, 1)), True, [512, 500], "frame of 500 bytes"),  # truncated gathered frame
        (((1, 1), (0, 1)), True, [256, 256, 256, 256], "4 frames for 2 runs"),  # per-run frames, said gathered
    ],
)
def test_bad_chunks_are_rejected_and_counted_never_written(runs, gathered, frame_bytes, problem):
    caches = zero_caches(SPEC, 4)
    receiver = KVReceiver(caches, SPEC, LOOPBACK)
    receiver.recv("r", [0, 1])
    sock = _raw_sender(receiver)
    sock.send_multipart([encode(KVChunk("r", 0, runs, 0, 2, gathered)), *[b"\x7f" * n for n in frame_bytes]])
    (event,) = poll_until_event(receiver, 200, 10)
    assert (event.kind, receiver.stats.rejected_chunks) == ("failed", 1) and problem in event.reason
    assert all(not t.any() for kv in caches for t in kv)
    sock.close()


def test_a_reservation_takes_chunks_and_an_abort_only_with_its_transfer_token():
    caches = zero_caches(SPEC, 4)
    receiver = KVReceiver(caches, SPEC, LOOPBACK)
    receiver.recv("r", [0, 1], transfer_token="the-reservations")
    before = refusals()
    stranger = _raw_sender(receiver)  # a member that passes the handshake but was not given the request
    for token in ("", "a-guess"):
        chunk = KVChunk("r", 0, ((0, 2),), 0, 2, transfer_token=token)
        stranger.send_multipart([encode(chunk), b"\x7f" * 512, b"\x7f" * 512])
    stranger.send_multipart([encode(Abort("r", "forged"))])
    refused = lambda: refusals().get(("kv", "wrong_transfer_token"), 0) - before.get(("kv", "wrong_transfer_token"), 0)
    for _ in range(500):
        if refused() == 3:
            break
        assert receiver.poll(10) == []  # neither written nor failed: the request's own transfer goes on
    assert refused() == 3 and receiver.stats.rejected_chunks == 2
    assert receiver.pending() == ["r"] and all(not t.any() for kv in caches for t in kv)

    sender, source = KVSender(SPEC, "p0"), random_caches(SPEC, 4, seed=1)
    with serving(receiver) as events:
        sender.send("r", [2, 3], PeerTarget(receiver.address, (0, 1), transfer_token="the-reservations"))
        for layer in range(SPEC.num_layers):
            sender.send_layer("r", layer, *source[layer])
        while not events:
            sender.poll(10)
    assert [(e.request_id, e.kind) for e in events] == [("r", "done")]
    for layer in range(SPEC.num_layers):
        assert all(same_bits(caches[layer][kv][0:2], source[layer][kv][2:4]) for kv in (0, 1))
    stranger.close()


def test_garbage_header_is_counted_and_ignored():
    receiver = KVReceiver(zero_caches(SPEC, 4), SPEC, LOOPBACK)
    sock = _raw_sender(receiver)
    sock.send_multipart([b"\x93garbage", b"x" * 64])
    while receiver.stats.rejected_chunks == 0:
        assert receiver.poll(10) == []
    sock.close()


def test_incompatible_peer_is_refused_at_handshake():
    receiver = KVReceiver(zero_caches(SPEC, 4), SPEC, LOOPBACK)
    other = KVSpec(**{**SPEC.__dict__, "block_size": 16})
    with serving(receiver):
        for sender, why in ((KVSender(other, "p0"), "block_size: peer 16 != ours 4"),
                            (KVSender(SPEC, "p1", tp_size=3), "TP size 3")):  # fmt: skip
            sender.send("r", [0], PeerTarget(receiver.address, (0,)))  # returns at once: the handshake follows
            sender.send_layer("r", 0, *zero_caches(SPEC, 4)[0])  # waits for it, then is dropped with the transfer
            (event,) = poll_until_event(sender, 400, 10)
            assert event.kind == "failed" and "refused us" in event.reason and why in event.reason
            assert not sender.pending() and not sender.sockets()  # the refused link is gone
            sender.close()
    assert receiver.stats.refused_peers == 2


def test_a_receiver_that_never_answers_fails_the_transfer_without_blocking():
    silent = zmq.Context.instance().socket(zmq.ROUTER)  # takes the connection, never answers
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    clock = FakeClock()
    sender = KVSender(SPEC, "p0", timeouts=TransferTimeouts(handshake_s=2.0), clock=clock)
    sender.send("r", [0], PeerTarget(f"tcp://127.0.0.1:{port}", (0,)))
    assert sender.poll(10) == [] and sender.pending() == [("r", f"tcp://127.0.0.1:{port}")]
    clock.now = 2.5
    (event,) = sender.poll(0)
    assert event.kind == "failed" and "did not answer the handshake" in event.reason
    sender.close()
    silent.close()


def test_chunked_prefill_sends_blocks_as_they_are_computed():
    caches = zero_caches(SPEC, 8)
    receiver = KVReceiver(caches, SPEC, LOOPBACK)
    receiver.recv("r", [4, 5, 6])
    sender = KVSender(SPEC, "p0")
    src = random_caches(SPEC, 8, seed=5)
    with serving(receiver) as events:
        sender.send("r", [0, 1, 2], PeerTarget(receiver.address, (4, 5, 6)))
        for layer in range(SPEC.num_layers):  # first prefill chunk: blocks 0 and 1
            sender.send_layer("r", layer, *src[layer], positions=range(0, 2))
        for _ in range(20):
            assert sender.poll(10) == []  # not done: block 2 is still missing
        for layer in range(SPEC.num_layers):  # second chunk
            sender.send_layer("r", layer, *src[layer], positions=range(2, 3))
        (event,) = poll_until_event(sender, 400, 10)
    assert event.kind == "done" and [e.kind for e in events] == ["done"]
    for (k, v), (k_src, v_src) in zip(caches, src):
        assert same_bits(k[4:7], k_src[0:3]) and same_bits(v[4:7], v_src[0:3])


# Runs here average 683 bytes of K + V: 1400 bytes make messages of 2 runs.
@pytest.mark.parametrize("message_bytes,runs_per_message", [(1, 1), (1400, 2), (2**30, 3)])
def test_zero_copy_runs_are_split_into_messages(message_bytes, runs_per_message):
    """Runs of a layer go out `message_bytes` at a time (whole runs); the cache ends up the same."""
    caches = zero_caches(SPEC, 8)
    receiver = KVReceiver(caches, SPEC, LOOPBACK)
    receiver.recv("r", [5, 6, 0, 3])
    sender = KVSender(SPEC, "p0", gather_below_bytes=0, message_bytes=message_bytes)  # blocks of 256 bytes
    src = random_caches(SPEC, 8, seed=9)
    with serving(receiver) as events:
        sender.send("r", [1, 2, 7, 4], PeerTarget(receiver.address, (5, 6, 0, 3)))  # runs of 2, 1, 1 blocks
        for layer in range(SPEC.num_layers):
            sender.send_layer("r", layer, *src[layer])
        (event,) = poll_until_event(sender, 400, 10)
    assert event.kind == "done" and [e.kind for e in events] == ["done"]
    assert receiver.stats.chunks_written == SPEC.num_layers * -(-3 // runs_per_message)
    for (k, v), (k_src, v_src) in zip(caches, src):
        assert same_bits(k[[5, 6, 0, 3]], k_src[[1, 2, 7, 4]]) and same_bits(v[[5, 6, 0, 3]], v_src[[1, 2, 7, 4]])
    sender.close()
    receiver.close()


def test_late_chunks_of_an_ended_request_never_touch_its_blocks():
    caches = zero_caches(SPEC, 4)
    receiver = KVReceiver(caches, SPEC, LOOPBACK)
    receiver.recv("r", [0, 1])
    sock = _raw_sender(receiver)
    receiver.abort("r")  # the caller may now hand blocks 0 and 1 to another request
    sock.send_multipart([encode(KVChunk("r", 0, ((0, 2),), 0, 2)), b"\x7f" * 512, b"\x7f" * 512])
    while receiver.stats.dropped_chunks == 0:
        assert receiver.poll(10) == []
    assert all(not t.any() for kv in caches for t in kv)
    sock.close()


def test_chunks_from_a_refused_sender_are_rejected():
    caches = zero_caches(SPEC, 4)
    receiver = KVReceiver(caches, SPEC, LOOPBACK)
    receiver.recv("r", [0, 1])
    sock = connect_dealer(zmq.Context.instance(), receiver.address, send_timeout_ms=5000)
    other = KVSpec(**{**SPEC.__dict__, "dtype": "bfloat16"})
    send_message(sock, Hello(PROTOCOL_VERSION, compat_hash(other), other, 1, 0, "raw", "zmq"))
    while not sock.poll(10):
        receiver.poll(10)
    assert isinstance(decode_header(sock.recv_multipart(copy=False)[0]), Refused)
    sock.send_multipart([encode(KVChunk("r", 0, ((0, 2),), 0, 2)), b"\x7f" * 512, b"\x7f" * 512])
    while receiver.stats.rejected_chunks == 0:
        assert receiver.poll(10) == []
    assert receiver.pending() == ["r"] and all(not t.any() for kv in caches for t in kv)
    sock.close()


def test_a_gloo_sender_that_never_joins_its_pair_does_not_block_the_receiver():
    """Its Hello asks for a gloo pair, then it never joins: the group is built off the receiver's thread
    (it waits up to the handshake timeout), so another sender's transfer lands meanwhile; once the timeout
    passes the silent sender is forgotten and its later chunks are rejected."""
    caches = zero_caches(SPEC, 4)
    receiver = KVReceiver(caches, SPEC, LOOPBACK, timeouts=TransferTimeouts(handshake_s=3.0))
    silent = connect_dealer(zmq.Context.instance(), receiver.address, send_timeout_ms=5000)
    send_message(silent, Hello(PROTOCOL_VERSION, compat_hash(SPEC), SPEC, 1, 0, "never-joins", "gloo"))
    while not silent.poll(10):
        assert receiver.poll(10) == []  # returns while the pair waits for its sender
    assert isinstance(decode_header(silent.recv_multipart(copy=False)[0]), Welcome)
    receiver.recv("r", [1])
    sender, sent = KVSender(SPEC, "p0"), random_caches(SPEC, 4, seed=3)
    sender.send("r", [2], PeerTarget(receiver.address, (1,)))
    with serving(receiver) as events:
        for layer in range(SPEC.num_layers):
            sender.send_layer("r", layer, *sent[layer])
        assert [(e.request_id, e.kind) for e in poll_until_event(sender, 400, 10)] == [("r", "done")]
        while not events:  # the receiver tells the sender before it returns the event from its poll
            sender.poll(10)
        assert [(e.request_id, e.kind) for e in events] == [("r", "done")]
        assert "never-joins" in _sender_names(receiver)  # still being waited for
        while "never-joins" in _sender_names(receiver):
            sender.poll(10)  # the pair's handshake timeout runs out on its thread; the receiver forgets it
    assert all(same_bits(caches[layer][i][1], sent[layer][i][2]) for layer in range(SPEC.num_layers) for i in (0, 1))
    sender.close()
    silent.close()


def _sender_names(receiver) -> list[str]:
    return [s.name for s in list(receiver._senders.values())]  # a copy: the serving thread changes them
