"""GPU paths: ZMQ through pinned host staging, and an NCCL pair. Skipped without CUDA (as in CI here)."""

from __future__ import annotations

import multiprocessing

import pytest
import torch

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
    serving,
    zero_caches,
)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _cuda(caches, device: str):
    return [(k.to(device), v.to(device)) for k, v in caches]


@needs_cuda
@pytest.mark.parametrize("gather_below_bytes", [0, 2**20])
def test_zmq_stages_gpu_blocks_through_host_memory(gather_below_bytes):
    src = _cuda(random_caches(SPEC, NUM_BLOCKS, seed=2), "cuda")
    dst = zero_caches(SPEC, NUM_BLOCKS, device="cuda")
    receiver = KVReceiver(dst, SPEC, "tcp://127.0.0.1:0", timeouts=FAST)
    receiver.recv("r", DST_BLOCKS)
    sender = KVSender(SPEC, "p0", timeouts=FAST, gather_below_bytes=gather_below_bytes)
    with serving(receiver) as events:
        sender.send("r", SRC_BLOCKS, PeerTarget(receiver.address, DST_BLOCKS))
        for layer in range(SPEC.num_layers):
            sender.send_layer("r", layer, *src[layer])
        assert [e.kind for e in poll_until_event(sender)] == ["done"]
    assert [e.kind for e in events] == ["done"]
    for (k, v), (k_src, v_src) in zip(dst, src):
        assert blocks_bytes(k, DST_BLOCKS) == blocks_bytes(k_src, SRC_BLOCKS)
        assert blocks_bytes(v, DST_BLOCKS) == blocks_bytes(v_src, SRC_BLOCKS)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_nccl_pair_between_two_processes():
    ctx = multiprocessing.get_context("spawn")
    reply = ctx.Queue()
    proc = ctx.Process(target=receiver_main, args=(reply, "tcp://127.0.0.1:0", "nccl", 0, "cuda:1"), daemon=True)
    proc.start()
    try:
        address = reply.get(timeout=120)
        torch.cuda.set_device("cuda:0")
        src = _cuda(random_caches(SPEC, NUM_BLOCKS, seed=1), "cuda:0")
        sender = KVSender(SPEC, "p0", data_plane="nccl", timeouts=FAST)
        sender.send("r", SRC_BLOCKS, PeerTarget(address, DST_BLOCKS))
        for layer in range(SPEC.num_layers):
            sender.send_layer("r", layer, *src[layer])
        assert [e.kind for e in poll_until_event(sender)] == ["done"]
        events, blocks = reply.get(timeout=120)
        assert [e.kind for e in events] == ["done"]
        assert blocks == [(blocks_bytes(k, SRC_BLOCKS), blocks_bytes(v, SRC_BLOCKS)) for k, v in src]
    finally:
        proc.kill()
        proc.join(10)
