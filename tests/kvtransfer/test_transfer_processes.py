"""Two real processes move KV blocks over each transport; kills prove the failure paths."""

from __future__ import annotations

import multiprocessing
import os
import signal

import pytest

from engine.block_pool import BlockPool
from kvtransfer import KVReceiver, KVSender, PeerTarget
from tests.kvtransfer.peers import (
    DST_BLOCKS,
    FAST,
    NUM_BLOCKS,
    SPEC,
    SRC_BLOCKS,
    blocks_bytes,
    poll_until_event,
    random_caches,
    receiver_main,
    sender_main,
    zero_caches,
)

CTX = multiprocessing.get_context("spawn")
REPLY_TIMEOUT_S = 60


@pytest.fixture
def child():
    procs = []

    def start(target, *args):
        reply = CTX.Queue()
        proc = CTX.Process(target=target, args=(reply, *args), daemon=True)
        proc.start()
        procs.append(proc)
        return proc, reply

    yield start
    for proc in procs:
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)


def _address(kind: str, tmp_path) -> str:
    return f"ipc://{tmp_path}/kv.sock" if kind == "zmq-ipc" else "tcp://127.0.0.1:0"


@pytest.mark.parametrize("gather_below_bytes", [0, 2**20], ids=["frame-per-run", "gathered"])
@pytest.mark.parametrize("kind", ["zmq-ipc", "zmq-tcp", "gloo"])
def test_blocks_arrive_bit_identical(kind, gather_below_bytes, child, tmp_path):
    _, reply = child(receiver_main, _address(kind, tmp_path), "gloo")
    address = reply.get(timeout=REPLY_TIMEOUT_S)
    caches = random_caches(SPEC, NUM_BLOCKS, seed=1)
    data_plane = "gloo" if kind == "gloo" else "zmq"
    sender = KVSender(SPEC, "prefill-0", data_plane=data_plane, timeouts=FAST, gather_below_bytes=gather_below_bytes)
    sender.send("r", SRC_BLOCKS, PeerTarget(address, DST_BLOCKS))
    for layer in range(SPEC.num_layers):
        sender.send_layer("r", layer, *caches[layer])
    assert [(e.request_id, e.kind) for e in poll_until_event(sender)] == [("r", "done")]
    events, blocks = reply.get(timeout=REPLY_TIMEOUT_S)
    assert [(e.request_id, e.kind) for e in events] == [("r", "done")]
    assert blocks == [(blocks_bytes(k, SRC_BLOCKS), blocks_bytes(v, SRC_BLOCKS)) for k, v in caches]
    sender.close()


def test_killed_receiver_lets_the_lease_expire_and_blocks_go_back(child):
    receiver, reply = child(receiver_main, "tcp://127.0.0.1:0", "gloo", 1)
    address = reply.get(timeout=REPLY_TIMEOUT_S)
    pool = BlockPool(NUM_BLOCKS)
    held = pool.allocate(len(SRC_BLOCKS))
    caches = random_caches(SPEC, NUM_BLOCKS, seed=1)
    sender = KVSender(SPEC, "prefill-0", timeouts=FAST)
    sender.send("r", [b.block_id for b in held], PeerTarget(address, DST_BLOCKS))
    sender.send_layer("r", 0, *caches[0])
    while reply.empty():  # keep heartbeats flowing until the receiver has written layer 0
        sender.poll(50)
    assert reply.get() == "progress"
    os.kill(receiver.pid, signal.SIGKILL)
    receiver.join(10)
    sender.send_layer("r", 1, *caches[1])  # mid-transfer: the receiver is gone
    (event,) = poll_until_event(sender)
    assert (event.request_id, event.kind) == ("r", "expired")
    pool.free(held)
    assert pool.num_free_blocks == NUM_BLOCKS and sender.pending() == []
    sender.close()


@pytest.mark.parametrize("data_plane", ["zmq", "gloo"])
def test_killed_sender_fails_the_request_and_frees_the_reservation(data_plane, child):
    caches = zero_caches(SPEC, NUM_BLOCKS)
    receiver = KVReceiver(caches, SPEC, "tcp://127.0.0.1:0", timeouts=FAST)
    pool = BlockPool(NUM_BLOCKS)
    reserved = pool.allocate(len(DST_BLOCKS))
    reserved_ids = [b.block_id for b in reserved]
    receiver.recv("r", reserved_ids)
    sender, reply = child(sender_main, receiver.address, reserved_ids, 1, data_plane)
    while reply.empty() or receiver.stats.bytes_written == 0:
        assert receiver.poll(50) == []
    os.kill(sender.pid, signal.SIGKILL)
    sender.join(10)
    (event,) = poll_until_event(receiver)
    assert (event.request_id, event.kind) == ("r", "failed") and "gone" in event.reason
    pool.free(reserved)
    assert pool.num_free_blocks == NUM_BLOCKS and receiver.pending() == []
    receiver.close()
