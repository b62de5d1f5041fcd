"""A prefill worker hosted in this process against a bare KV receiver: it frees its blocks on every end of a transfer.

done: the receiver's blocks hold the prefill's KV bit for bit; failed: the receiver
rejects a chunk; expired: the receiver stopped expecting the request and its
heartbeats no longer renew the lease. Each end reaches decode's inbox as it would.
"""

from __future__ import annotations

import pytest

from engine import EngineArgs
from runtime.engine_bridge import kv_spec_for, sampling_spec
from wire.requests import DecodeReservation, FirstToken, GenerateRequest, PrefillFailed, PrefillTask
from kvtransfer.receiver import KVReceiver
from wire.push_pull import PullSocket, TokenStream
from prefill_worker.actor import prefill_worker_maker
from prefill_worker.records import Phase
from prefill_worker.worker import PrefillWorkerConfig
from runtime.hosting import HostedWorker
from tests.conftest import hf_greedy
from tests.e2e.harness import GREEDY, PROMPTS, wait_for
from tests.kvtransfer.peers import FAST, same_bits, serving, zero_caches


@pytest.fixture
def rig(tiny_model_dirs):
    model_dir = tiny_model_dirs["llama"]
    args = EngineArgs(model=model_dir, num_kv_blocks=32, max_model_len=256, dtype="float32")
    hosted = HostedWorker("p0", prefill_worker_maker(args, PrefillWorkerConfig("p0", timeouts=FAST)))
    spec = kv_spec_for(hosted.worker.engine.config)
    receiver = KVReceiver(zero_caches(spec, 16), spec, "tcp://127.0.0.1:0", timeouts=FAST)
    inbox, stream = PullSocket((FirstToken, PrefillFailed)), TokenStream()
    yield model_dir, hosted, receiver, inbox, stream
    hosted.stop()
    for closable in (receiver, inbox, stream):
        closable.close()


def _task(request_id, prompt, dst_block_ids, receiver, inbox, stream) -> PrefillTask:
    request = GenerateRequest(request_id, tuple(prompt), sampling_spec(GREEDY), stream.address)
    return PrefillTask(request, DecodeReservation(request_id, False, receiver.address, inbox.address,
                                                  tuple(dst_block_ids)))  # fmt: skip


def _fill(got: list, inbox: PullSocket, count: int) -> bool:
    got += inbox.poll(10)
    return len(got) >= count


def test_done_moves_the_kv_bit_for_bit_then_frees(rig):
    model_dir, hosted, receiver, inbox, stream = rig
    prompt = PROMPTS["shared-b"]  # 60 tokens: 4 blocks
    receiver.recv("r", [9, 3, 4, 12])
    hosted.call("prefill", _task("r", prompt, [9, 3, 4, 12], receiver, inbox, stream))
    records = hosted.worker.records
    # The forward ran and its layers wait on the sender until the receiver answers: the blocks are held.
    wait_for(lambda: "r" in records and records["r"].phase is Phase.SENDING, "the forward")
    src = [b.block_id for b in records["r"].request.blocks]
    with serving(receiver) as events:
        wait_for(hosted.is_clean, "the transfer to end and the blocks to be free")
    assert [e.kind for e in events] == ["done"]
    for (k, v), (k_src, v_src) in zip(receiver.kv_caches, hosted.worker.engine.runner.kv_caches):
        assert same_bits(k[[9, 3, 4, 12]], k_src[src]) and same_bits(v[[9, 3, 4, 12]], v_src[src])
    first = hf_greedy(model_dir, prompt, 1)[0]
    got = []
    wait_for(lambda: _fill(got, inbox, 1), "the first token in decode's inbox")
    assert got == [FirstToken("r", first)]
    stream.poll(1000)
    assert stream.requests["r"].token_ids == [first]
    load = hosted.heartbeat()
    assert (load.waiting, load.running, load.transferring, load.steps, load.step_running_s) == (0, 0, 0, 1, 0.0)


def test_failed_and_expired_transfers_free_the_blocks_and_tell_decode(rig):
    _, hosted, receiver, inbox, stream = rig
    receiver.recv("short", [1, 2])  # the task below names a third block: its chunks are rejected
    receiver.recv("gone", [5, 6])
    receiver.abort("gone")  # no longer expected: chunks dropped, heartbeats stop listing it
    got = []
    with serving(receiver) as events:
        hosted.call("prefill", _task("short", PROMPTS["mid"] + [5] * 10, [1, 2, 3], receiver, inbox, stream))
        hosted.call("prefill", _task("gone", PROMPTS["mid"], [5, 6], receiver, inbox, stream))
        wait_for(lambda: _fill(got, inbox, 4), "first tokens and failures in decode's inbox")
        wait_for(hosted.is_clean, "every block to be free")
    assert [(e.request_id, e.kind) for e in events] == [("short", "failed")]
    failures = {m.request_id: m.reason for m in got if isinstance(m, PrefillFailed)}
    assert "failed" in failures["short"] and "expired" in failures["gone"]
    assert receiver.stats.dropped_chunks > 0


def test_abort_while_queued_or_transferring_frees_everything(rig):
    _, hosted, receiver, inbox, stream = rig
    receiver.recv("moving", [5, 6])
    hosted.call("prefill", _task("queued", PROMPTS["mid"], [1, 2], receiver, inbox, stream))
    hosted.call("abort", "queued")  # before (or after) any forward: nothing is left
    wait_for(hosted.is_clean, "the queued request to be gone")
    hosted.call("prefill", _task("moving", PROMPTS["mid"], [5, 6], receiver, inbox, stream))
    records = hosted.worker.records
    wait_for(lambda: "moving" in records and records["moving"].phase is Phase.SENDING, "the forward")
    hosted.call("abort", "moving")  # the sender lets go and tells the receiver; then the blocks are free
    with serving(receiver) as events:
        wait_for(hosted.is_clean, "the transferring request to be released")
        wait_for(lambda: receiver.pending() == [] or events, "the receiver to hear of it", 10)
    got = []
    wait_for(lambda: _fill(got, inbox, 1), "the first token")
    assert not any(isinstance(m, PrefillFailed) for m in got)  # an abort is no failure decode must hear of
