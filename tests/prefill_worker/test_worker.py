"""A prefill worker against a bare KV receiver: it frees its blocks on every end of a transfer.

done: the receiver's blocks hold the prefill's KV bit for bit; failed: the receiver
rejects a chunk; expired: the receiver stopped expecting the request and its
heartbeats no longer renew the lease. The worker is stepped here, on the test's thread.
"""

from __future__ import annotations

import time

import pytest

from engine import EngineArgs
from kvtransfer.engine_bridge import kv_spec_for, sampling_spec
from kvtransfer.protocol import DecodeReservation, FirstToken, GenerateRequest, PrefillTask
from kvtransfer.receiver import KVReceiver
from kvtransfer.token_stream import PullSocket, TokenStream
from prefill_worker.worker import PrefillWorker, PrefillWorkerConfig
from tests.conftest import hf_greedy
from tests.e2e.harness import GREEDY, PROMPTS
from tests.kvtransfer.peers import FAST, same_bits, serving, zero_caches


@pytest.fixture
def rig(tiny_model_dirs):
    model_dir = tiny_model_dirs["llama"]
    worker = PrefillWorker(EngineArgs(model=model_dir, num_kv_blocks=32, max_model_len=256),
                           PrefillWorkerConfig("p0", timeouts=FAST))  # fmt: skip
    spec = kv_spec_for(worker.engine.config)
    receiver = KVReceiver(zero_caches(spec, 16), spec, "tcp://127.0.0.1:0", timeouts=FAST)
    inbox, stream = PullSocket((FirstToken,)), TokenStream()
    yield model_dir, worker, receiver, inbox, stream
    worker.close()
    for closable in (receiver, inbox, stream):
        closable.close()


def _task(request_id, prompt, dst_block_ids, receiver, inbox, stream) -> PrefillTask:
    request = GenerateRequest(request_id, tuple(prompt), sampling_spec(GREEDY), stream.address)
    return PrefillTask(request, DecodeReservation(request_id, False, receiver.address, inbox.address,
                                                  tuple(dst_block_ids)))  # fmt: skip


def _step_until_idle(worker: PrefillWorker, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not worker.is_idle():
        assert time.monotonic() < deadline, "prefill worker never went idle"
        worker.step()
        time.sleep(0.002)


def test_done_moves_the_kv_bit_for_bit_then_frees(rig):
    model_dir, worker, receiver, inbox, stream = rig
    prompt = PROMPTS["shared-b"]  # 60 tokens: 4 blocks
    receiver.recv("r", [9, 3, 4, 12])
    with serving(receiver) as events:
        worker.prefill(_task("r", prompt, [9, 3, 4, 12], receiver, inbox, stream))
        worker.step()  # the forward, sending each layer as it is computed
        src = [b.block_id for b in worker._held["r"].blocks]
        _step_until_idle(worker)
    assert [e.kind for e in events] == ["done"] and worker.transfers_ended == {"done": 1}
    for (k, v), (k_src, v_src) in zip(receiver.kv_caches, worker.engine.runner.kv_caches):
        assert same_bits(k[[9, 3, 4, 12]], k_src[src]) and same_bits(v[[9, 3, 4, 12]], v_src[src])
    first = hf_greedy(model_dir, prompt, 1)[0]
    assert inbox.poll(1000) == [FirstToken("r", first)]
    stream.poll(1000)
    assert stream.requests["r"].token_ids == [first]
    load = worker.load()
    assert worker.pool_all_free() and (load.waiting, load.running, load.transferring) == (0, 0, 0)


def test_failed_and_expired_transfers_free_the_blocks(rig):
    _, worker, receiver, inbox, stream = rig
    receiver.recv("short", [1, 2])  # the task below names a third block: its chunks are rejected
    receiver.recv("gone", [5, 6])
    receiver.abort("gone")  # no longer expected: chunks dropped, heartbeats stop listing it
    with serving(receiver) as events:
        worker.prefill(_task("short", PROMPTS["mid"] + [5] * 10, [1, 2, 3], receiver, inbox, stream))
        worker.prefill(_task("gone", PROMPTS["mid"], [5, 6], receiver, inbox, stream))
        _step_until_idle(worker)
    assert [(e.request_id, e.kind) for e in events] == [("short", "failed")]
    assert worker.transfers_ended == {"failed": 1, "expired": 1}
    assert receiver.stats.dropped_chunks > 0 and worker.pool_all_free()


def test_abort_while_queued_or_transferring_frees_at_once(rig):
    _, worker, receiver, inbox, stream = rig
    receiver.recv("moving", [5, 6])
    with serving(receiver):
        worker.prefill(_task("queued", PROMPTS["mid"], [1, 2], receiver, inbox, stream))
        worker.abort("queued")  # before any forward
        assert worker.is_idle() and worker.pool_all_free() and not worker.engine.requests
        worker.prefill(_task("moving", PROMPTS["mid"], [5, 6], receiver, inbox, stream))
        worker.step()  # forward done, every layer handed to the sender
        assert worker.load().transferring == 1
        worker.abort("moving")  # the sender tells the receiver; the blocks are ours to free now
        assert worker.is_idle() and worker.pool_all_free()
        assert worker.sender.pending() == []
