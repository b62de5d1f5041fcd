"""The prefill worker's request state machine, driven on the test's thread with fake connector events.

A real tiny engine; the I/O thread, the rank links and the pushers are fakes that record what the
worker asks of them. Every path ends with the engine's pool all free, and with decode told of a
failure (PrefillFailed) exactly when there was one.
"""

from __future__ import annotations

import time

import pytest

from engine import EngineArgs, LLMEngine, SamplingParams
from wire.codec import decode
from runtime.engine_bridge import sampling_spec
from wire.ranks import DropShard, RankAck, ShardOrders, TransferEnded
from wire.requests import DecodeReservation, FirstToken, GenerateRequest, PrefillFailed, PrefillTask, TokenDelta
from prefill_worker.kv_sending import (
    SendLayer,
    StartSend,
)
from prefill_worker.records import Phase
from prefill_worker.worker import PrefillWorker, PrefillWorkerConfig
from runtime.control_service import Call
from runtime.load_board import LoadBoard
from runtime.transfer_service import Release, Released
from tests.decode_worker.test_records import Answers, FakeIO, FakePushers, FakeRanks, compiled_delivered
from tests.e2e.harness import GREEDY, PROMPTS

DECODE = "tcp://decode-kv:1"


@pytest.fixture
def rig(tiny_model_dirs):
    def make(budget: int = 2048, **config):
        args = EngineArgs(model=tiny_model_dirs["llama"], num_kv_blocks=32, max_model_len=256,
                          max_num_batched_tokens=budget, dtype="float32")  # fmt: skip
        engine = LLMEngine.from_args(args, skip_tokenizer_init=True, show_progress=False)
        io, pushers = FakeIO(), FakePushers()
        worker = PrefillWorker(engine, PrefillWorkerConfig(**config), io, LoadBoard("p"), pushers, deliver=io.post)
        return worker, io, pushers

    return make


def _prefill(worker: PrefillWorker, rid: str, prompt=PROMPTS["long"]) -> Answers:
    answers = Answers()
    request = GenerateRequest(rid, tuple(prompt), sampling_spec(GREEDY), "tcp://stream:1")
    reservation = DecodeReservation(rid, False, DECODE, "tcp://inbox:1", tuple(range(-(-len(prompt) // 16))))
    worker.handle(Call("prefill", PrefillTask(request, reservation), answers))
    return answers


def _failures(pushers: FakePushers) -> list[PrefillFailed]:
    return [m for m in pushers.sent if isinstance(m, PrefillFailed)]


def _pool_free(worker: PrefillWorker) -> bool:
    kv = worker.engine.kv_cache
    return kv.num_free_blocks == kv.pool.num_blocks and not worker.records and not worker.engine.requests


def test_an_abort_ends_a_request_in_every_phase_but_releasing_where_it_is_ending_already():
    events = {event for by_event in PrefillWorker.transitions.values() for event in by_event}
    aborted = {phase for phase, by_event in PrefillWorker.transitions.items() if PrefillWorker.events.ABORT in by_event}
    assert aborted == set(Phase) - {Phase.RELEASING} and PrefillWorker.events.STEP_FAILED in events


def test_the_forward_opens_the_transfer_ships_each_layer_and_hands_the_first_token_over(rig):
    worker, io, pushers = rig()
    assert _prefill(worker, "r").got == [None]
    assert worker.records["r"].phase is Phase.QUEUED and not io.posted
    worker.step()
    (start,) = io.take(StartSend)
    layers = io.take(SendLayer)
    assert [c.layer for c in layers] == list(range(worker.engine.config.model.num_layers))
    assert all(c.request_ids == ("r",) for c in layers) and start.order.request_id == "r"
    assert worker.records["r"].phase is Phase.SENDING and worker.records["r"].transfers == {(0, DECODE)}
    delta, first = pushers.sent
    assert isinstance(delta, TokenDelta) and first == FirstToken("r", delta.token_ids[0])
    assert worker.engine.kv_cache.num_free_blocks < 32  # held while the sender reads them
    worker.handle(TransferEnded("r", 0, "done", DECODE))
    assert _pool_free(worker) and not _failures(pushers)


@pytest.mark.parametrize("kind", ["failed", "expired"])
def test_a_failed_transfer_is_released_by_the_sender_before_the_blocks_go_and_decode_hears_of_it(rig, kind):
    worker, io, pushers = rig()
    _prefill(worker, "r")
    worker.step()
    io.posted.clear()
    worker.handle(TransferEnded("r", 0, kind, DECODE, "receiver silent"))
    (release,) = io.take(Release)
    assert worker.records["r"].phase is Phase.RELEASING and not _failures(pushers)
    assert worker.engine.kv_cache.num_free_blocks < 32
    worker.handle(TransferEnded("r", 0, "done", DECODE))  # late news: ignored
    worker.handle(Released("r"))
    (failed,) = _failures(pushers)
    assert kind in failed.reason and failed.reason == release.reason and _pool_free(worker)


def test_an_abort_while_queued_frees_at_once_and_while_sending_after_the_release(rig):
    worker, io, pushers = rig()
    _prefill(worker, "queued")
    worker.handle(Call("abort", "queued", Answers()))
    assert _pool_free(worker) and not io.posted
    _prefill(worker, "sending")
    worker.step()
    io.posted.clear()
    worker.handle(Call("abort", "sending", Answers()))
    assert io.take(Release) and worker.records["sending"].phase is Phase.RELEASING
    worker.handle(Released("sending"))
    assert _pool_free(worker) and not _failures(pushers)  # an abort is nothing decode must hear of


@pytest.mark.parametrize("phase", ["queued", "sending"])
def test_a_failed_step_fails_its_requests_and_tells_decode(rig, monkeypatch, phase):
    worker, io, pushers = rig(budget=16 if phase == "queued" else 2048)  # queued: a chunk, not the prompt's end
    _prefill(worker, "r")
    monkeypatch.setattr(worker.engine.runner, "execute", lambda *a: 1 / 0)
    assert worker.step() is False
    if phase == "sending":
        assert io.take(StartSend) and worker.records["r"].phase is Phase.RELEASING
        worker.handle(Released("r"))
    else:
        assert not io.posted  # nothing was opened
    (failed,) = _failures(pushers)
    assert "engine step failed" in failed.reason and _pool_free(worker)


def test_tensor_parallel_orders_ride_on_the_step_and_every_rank_lets_go_before_the_blocks_do(rig, monkeypatch):
    worker, io, pushers = rig(rank_ack_timeout_s=0.01)
    worker.ranks = ranks = FakeRanks()
    worker.tp_size = 2
    attachments, execute = [], worker.engine.runner.execute
    monkeypatch.setattr(worker.engine.runner, "execute", lambda batch, attachment, layer_done:
                        attachments.append(attachment) or execute(batch, attachment, layer_done))  # fmt: skip
    _prefill(worker, "r")
    worker.step()
    (attachment,) = attachments  # the step broadcast's: the followers learn which transfers they start
    assert [o.request_id for o in decode(attachment, ShardOrders).orders] == ["r"]
    assert worker.records["r"].transfers == {(0, DECODE), (1, DECODE)}  # both ranks' heads go to decode
    worker.handle(TransferEnded("r", 0, "done", DECODE))
    worker.handle(Call("abort", "r", Answers()))
    assert isinstance(ranks.told[-1], DropShard) and io.take(Release)
    worker.handle(Released("r"))
    assert worker.records["r"].phase is Phase.RELEASING  # rank 1 has not let go yet
    ranks.inbox.append(RankAck("r", 1, "DropShard"))
    worker.read_sockets()
    assert _pool_free(worker)
    _prefill(worker, "slow")
    worker.step()
    worker.handle(TransferEnded("slow", 0, "failed", DECODE, "refused"))
    worker.handle(Released("slow"))
    worker.check_deadlines(now=time.monotonic() + 0.02)  # rank 1 never acks: freed anyway (logged), decode told
    assert _pool_free(worker) and [f.request_id for f in _failures(pushers)] == ["slow"]


def test_a_prompt_waits_for_its_grammar_compiled_elsewhere_and_an_abort_meanwhile_refuses_it(rig):
    worker, io, pushers = rig()

    def prefill(rid: str, regex: str) -> Answers:
        answers, prompt = Answers(), PROMPTS["mid"]
        params = SamplingParams(temperature=0, max_tokens=8, structured=("regex", regex))
        request = GenerateRequest(rid, tuple(prompt), sampling_spec(params), "tcp://stream:1")
        reservation = DecodeReservation(rid, False, DECODE, "tcp://inbox:1", tuple(range(-(-len(prompt) // 16))))
        worker.handle(Call("prefill", PrefillTask(request, reservation), answers))
        return answers

    answers = prefill("g", "[a-c]{3}")
    assert worker.records["g"].phase is Phase.COMPILING and not answers.got and worker.snapshot().load.waiting == 1
    worker.handle(compiled_delivered(io))
    assert answers.got == [None] and worker.records["g"].phase is Phase.QUEUED
    worker.handle(Call("abort", "g", Answers()))
    # Aborted while its grammar compiles: refused, nothing was queued; the compile's late answer is ignored.
    answers = prefill("g2", "[d-f]{3}")
    worker.handle(Call("abort", "g2", Answers()))
    assert isinstance(answers.got[0], ValueError) and "client" in str(answers.got[0])
    worker.handle(compiled_delivered(io))
    assert _pool_free(worker) and not _failures(pushers)
