"""The decode worker's request state machine, driven on the test's thread with fake connector events.

A real tiny engine; the I/O thread, the inbox, the rank links and the token pushers are fakes that
record what the worker asks of them and hand it the events a test chooses. Every path ends with the
engine's pool all free.
"""

from __future__ import annotations

import re
import time

import pytest

from decode_worker.kv_receiving import (
    AnswerAfter,
    ExpectKV,
)
from decode_worker.records import Phase
from decode_worker.worker import DecodeWorker, DecodeWorkerConfig
from engine import EngineArgs, LLMEngine, SamplingParams
from kvtransfer.connector import TransferTimeouts
from runtime.engine_bridge import sampling_spec
from wire.ranks import DropShard, ExpectShard, RankAck, TransferEnded
from wire.requests import DecodeReservation, FirstToken, GenerateRequest, PrefillFailed, ReserveRefused
from runtime.control_service import Call
from runtime.grammar_compiles import GrammarCompiled
from runtime.load_board import LoadBoard
from runtime.transfer_service import Release, Released
from tests.conftest import hf_greedy
from tests.e2e.harness import GREEDY, PROMPTS


class FakeIO:
    def __init__(self):
        self.posted = []

    def post(self, command) -> None:
        self.posted.append(command)

    def stop(self) -> None:
        pass

    def take(self, kind) -> list:
        found = [c for c in self.posted if isinstance(c, kind)]
        self.posted = [c for c in self.posted if not isinstance(c, kind)]
        return found


class FakeInbox:
    address = "tcp://inbox:1"
    socket = None

    def __init__(self):
        self.queued = []

    def poll(self, timeout_ms: int = 0) -> list:
        got, self.queued = self.queued, []
        return got

    def close(self) -> None:
        pass


class FakePushers:
    def __init__(self):
        self.sent = []

    def send(self, address: str, msg) -> bool:
        self.sent.append(msg)
        return True

    def close(self) -> None:
        pass


class FakeRanks:
    """Rank 0's links to one follower rank (rank 1)."""

    ranks = [1]

    def __init__(self):
        self.told, self.inbox = [], []
        self.endpoints = {1: type("Endpoint", (), {"kv_address": "tcp://rank1:2"})()}

    def tell(self, msg) -> None:
        self.told.append(msg)

    def read(self) -> list:
        got, self.inbox = self.inbox, []
        return got

    def close(self) -> None:
        pass


class Answers:
    def __init__(self):
        self.got = []

    def __call__(self, result=None, error=None):
        self.got.append(error if error is not None else result)


@pytest.fixture
def rig(tiny_model_dirs):
    def make(**config):
        model_dir = tiny_model_dirs["llama"]
        engine = LLMEngine.from_args(EngineArgs(model=model_dir, num_kv_blocks=32, max_model_len=256, dtype="float32"),
                                     show_progress=False)  # fmt: skip
        io, inbox, pushers = FakeIO(), FakeInbox(), FakePushers()
        # The fake I/O thread also collects what the worker posts to its own loop (a compiled grammar).
        worker = DecodeWorker(engine, DecodeWorkerConfig(**config), io, LoadBoard("d"), "tcp://kv:1", inbox, pushers,
                              deliver=io.post)  # fmt: skip
        return model_dir, worker, io, inbox, pushers

    return make


def _reserve(worker: DecodeWorker, rid: str, prompt, local: bool = False) -> Answers:
    answers = Answers()
    request = GenerateRequest(rid, tuple(prompt), sampling_spec(GREEDY), "tcp://stream:1", local_prefill=local)
    worker.handle(Call("reserve", request, answers))
    return answers


def _run(worker: DecodeWorker) -> None:
    while worker.has_work():
        worker.step()


def _tokens(pushers: FakePushers, rid: str) -> dict[int, int]:
    out = {}
    for delta in pushers.sent:
        if delta.request_id == rid:
            out.update({delta.first_index + i: t for i, t in enumerate(delta.token_ids)})
    return out


def _final(pushers: FakePushers, rid: str):
    return next(d for d in reversed(pushers.sent) if d.request_id == rid and d.finished)


def _pool_free(worker: DecodeWorker) -> bool:
    kv = worker.engine.kv_cache
    return kv.num_free_blocks == kv.pool.num_blocks and not worker.records and not worker.engine.requests


def test_an_abort_ends_a_request_in_every_phase_but_releasing_where_it_is_ending_already():
    events = {event for by_event in DecodeWorker.transitions.values() for event in by_event}
    aborted = {phase for phase, by_event in DecodeWorker.transitions.items() if DecodeWorker.events.ABORT in by_event}
    assert aborted == set(Phase) - {Phase.RELEASING} and DecodeWorker.events.STEP_FAILED in events


def test_kv_and_first_token_admit_the_request_which_decodes_to_the_end(rig):
    model_dir, worker, io, inbox, pushers = rig()
    prompt = PROMPTS["long"]
    answers = _reserve(worker, "r", prompt)
    (expect,) = io.take(ExpectKV)
    (answer,) = io.take(AnswerAfter)  # answered through the I/O thread, after ExpectKV
    assert answers.got == [] and isinstance(answer.result, DecodeReservation)
    assert expect.block_ids == answer.result.block_ids and worker.records["r"].phase is Phase.AWAITING_KV
    expected = hf_greedy(model_dir, prompt, 8)
    # The KV lands (written into the reserved blocks by the receiver: here, decode's own prefill of it).
    reference = LLMEngine.from_args(EngineArgs(model=model_dir, num_kv_blocks=32, max_model_len=256, dtype="float32"),
                                    show_progress=False)  # fmt: skip
    _copy_prompt_kv(reference, worker.engine, prompt, expect.block_ids)
    worker.handle(TransferEnded("r", 0, "done"))
    assert not worker.has_work()  # waiting for the first token
    inbox.queued.append(FirstToken("r", expected[0]))
    worker.read_sockets()
    assert worker.records["r"].phase is Phase.RUNNING
    _run(worker)
    assert list(_tokens(pushers, "r").values()) == expected[1:]  # the first token is the prefill worker's to send
    assert _final(pushers, "r").finish_reason == "length" and _pool_free(worker)


def _copy_prompt_kv(reference: LLMEngine, engine: LLMEngine, prompt, block_ids) -> None:
    from engine.remote_kv import add_prefill_request, release_blocks

    req = add_prefill_request(reference, "x", prompt, GREEDY)
    while reference.has_unfinished_requests():
        reference.step()
    src = [b.block_id for b in req.blocks]
    for (k, v), (k_ref, v_ref) in zip(engine.runner.kv_caches, reference.runner.kv_caches):
        k[list(block_ids)] = k_ref[src]
        v[list(block_ids)] = v_ref[src]
    release_blocks(reference, req)


@pytest.mark.parametrize("first_token_came", [False, True])
def test_a_failed_transfer_waits_for_the_release_then_recomputes_here(rig, first_token_came):
    model_dir, worker, io, inbox, pushers = rig()
    prompt = PROMPTS["mid"]
    expected = hf_greedy(model_dir, prompt, 8)
    _reserve(worker, "r", prompt)
    io.posted.clear()
    if first_token_came:
        inbox.queued.append(FirstToken("r", expected[0]))
        worker.read_sockets()
    worker.handle(TransferEnded("r", 0, "failed", reason="sender gone"))
    assert io.take(Release) == [Release("r", "KV transfer failed: sender gone")]
    assert worker.records["r"].phase is Phase.RELEASING and not worker.has_work()
    assert worker.engine.kv_cache.num_free_blocks < 32  # still reserved: the receiver may be writing
    worker.handle(TransferEnded("r", 0, "done"))  # late news for a releasing request: ignored
    worker.handle(Released("r"))
    assert worker.records["r"].phase is Phase.RUNNING
    _run(worker)
    tokens = _tokens(pushers, "r")
    assert [tokens[i] for i in range(int(first_token_came), 8)] == expected[int(first_token_came):]
    final = _final(pushers, "r")
    assert (final.finish_reason, final.num_prompt_tokens, final.num_output_tokens) == ("length", len(prompt), 8)
    assert _pool_free(worker)


@pytest.mark.parametrize("how", ["fail policy", "prefill failed", "abort", "no first token"])
def test_every_other_end_of_a_waiting_request_releases_then_ends_it(rig, how):
    config = {"kv_transfer_failure": "fail"} if how == "fail policy" else {}
    if how == "no first token":
        config["timeouts"] = TransferTimeouts(transfer_s=0.01)
    _, worker, io, inbox, pushers = rig(**config)
    _reserve(worker, "r", PROMPTS["mid"])
    io.posted.clear()
    if how == "fail policy":
        worker.handle(TransferEnded("r", 0, "failed", reason="chunk rejected"))
    elif how == "prefill failed":
        worker.config = DecodeWorkerConfig(kv_transfer_failure="fail")
        inbox.queued.append(PrefillFailed("r", "its step failed"))
        worker.read_sockets()
    elif how == "abort":
        worker.handle(Call("abort", "r", Answers()))
    else:
        worker.handle(TransferEnded("r", 0, "done"))
        worker.check_deadlines(now=time.monotonic() + 0.02)
    (release,) = io.take(Release)
    assert worker.records["r"].phase is Phase.RELEASING and not pushers.sent
    worker.handle(Released("r"))
    final = _final(pushers, "r")
    assert final.finish_reason == "abort" and release.reason == final.error and final.error
    assert _pool_free(worker)


def test_local_prefill_runs_here_and_an_abort_ends_it_at_once(rig):
    model_dir, worker, io, inbox, pushers = rig()
    answers = _reserve(worker, "local", PROMPTS["mid"], local=True)
    assert answers.got == [DecodeReservation("local", prefill_locally=True)] and not io.posted
    worker.step()  # prefill and first token
    worker.handle(Call("abort", "local", Answers()))
    assert _final(pushers, "local").error == "aborted by the client" and _pool_free(worker)


def test_tensor_parallel_reserve_is_answered_once_every_rank_acked(rig):
    _, worker, io, inbox, pushers = rig()
    worker.ranks = ranks = FakeRanks()
    worker.tp_size = 2
    answers = _reserve(worker, "r", PROMPTS["mid"])
    assert worker.records["r"].phase is Phase.EXPECTING_SHARDS and isinstance(ranks.told[0], ExpectShard)
    assert not io.take(AnswerAfter)
    ranks.inbox.append(RankAck("r", 1, "ExpectShard"))
    worker.read_sockets()
    (answer,) = io.take(AnswerAfter)
    assert answer.result.kv_addresses == ("tcp://kv:1", "tcp://rank1:2") and answers.got == []
    worker.handle(TransferEnded("r", 0, "done"))
    inbox.queued.append(FirstToken("r", 5))
    worker.read_sockets()
    assert worker.records["r"].phase is Phase.AWAITING_KV  # rank 1's shard has not landed
    ranks.inbox.append(TransferEnded("r", 1, "failed", reason="rejected"))
    worker.read_sockets()  # fails on every rank: both must let go before the recompute
    assert io.take(Release) and isinstance(ranks.told[-1], DropShard)
    worker.handle(Released("r"))
    assert worker.records["r"].phase is Phase.RELEASING
    ranks.inbox.append(RankAck("r", 1, "DropShard"))
    worker.read_sockets()
    assert worker.records["r"].phase is Phase.RUNNING
    _run(worker)
    assert _final(pushers, "r").finish_reason == "length" and _pool_free(worker)


def test_a_rank_that_never_acks_refuses_the_reserve_and_is_let_go_of(rig):
    _, worker, io, inbox, pushers = rig(rank_ack_timeout_s=0.01)
    worker.ranks, worker.tp_size = FakeRanks(), 2
    answers = _reserve(worker, "r", PROMPTS["mid"])
    worker.check_deadlines(now=time.monotonic() + 0.02)
    (refused,) = answers.got
    assert isinstance(refused, ReserveRefused) and "[1] did not acknowledge" in refused.reason
    worker.handle(Released("r"))
    worker.check_deadlines(now=time.monotonic() + 0.02)  # rank 1 never lets go either: freed anyway (logged)
    assert _pool_free(worker) and not pushers.sent  # a refused reserve was never the client's


def test_the_router_lease_ends_everything_and_a_failed_step_ends_its_requests(rig, monkeypatch):
    _, worker, io, inbox, pushers = rig(router_lease_s=0.01)
    _reserve(worker, "waiting", PROMPTS["mid"])
    _reserve(worker, "local", PROMPTS["tiny"], local=True)
    monkeypatch.setattr(worker.engine.runner, "execute", lambda *a: 1 / 0)
    assert worker.step() is False  # the local request's step failed: it ends, its blocks are free
    assert _final(pushers, "local").resumable and "local" not in worker.records  # for the router to move
    worker.check_deadlines(now=time.monotonic() + 0.02)
    assert worker.records["waiting"].phase is Phase.RELEASING
    worker.handle(Released("waiting"))
    assert "no call from the router" in _final(pushers, "waiting").error and _pool_free(worker)


def compiled_delivered(io: FakeIO, timeout_s: float = 60.0) -> GrammarCompiled:
    """What the compile thread posted to the worker's loop (here: the fake I/O thread's list)."""
    deadline = time.monotonic() + timeout_s
    while not (found := io.take(GrammarCompiled)):
        assert time.monotonic() < deadline, "no compiled grammar came back"
        time.sleep(0.01)
    (compiled,) = found
    return compiled


def test_a_request_waits_for_its_grammar_compiled_elsewhere_and_an_abort_meanwhile_refuses_it(rig):
    _, worker, io, _, pushers = rig(local_prefill_threshold=10**6)

    def reserve(rid: str, regex: str) -> Answers:
        answers, params = Answers(), SamplingParams(temperature=0, max_tokens=8, structured=("regex", regex))
        worker.handle(Call("reserve", GenerateRequest(rid, tuple(PROMPTS["mid"]), sampling_spec(params), "tcp://s:1"),
                           answers))  # fmt: skip
        return answers

    answers = reserve("g", "[a-c]{3}")
    assert worker.records["g"].phase is Phase.COMPILING and not answers.got and not worker.engine.requests
    assert worker.snapshot().load.waiting == 1  # the router sees it queued
    worker.handle(compiled_delivered(io))
    assert answers.got[0].prefill_locally and worker.records["g"].phase is Phase.RUNNING
    while worker.engine.has_unfinished_requests():  # every step, the arrival window's wait included
        worker.step()
    text = worker.engine.tokenizer.decode(list(_tokens(pushers, "g").values()), skip_special_tokens=True)
    assert re.fullmatch("[a-c]{3}", text) and _final(pushers, "g").finish_reason == "stop"
    # Cached now: the same grammar is taken at once.
    assert reserve("g2", "[a-c]{3}").got[0].prefill_locally
    worker.handle(Call("abort", "g2", Answers()))
    # Aborted while its grammar compiles: refused, nothing was reserved; the compile's late answer is ignored.
    answers = reserve("g3", "[d-f]{3}")
    worker.handle(Call("abort", "g3", Answers()))
    assert isinstance(answers.got[0], ReserveRefused) and "client" in answers.got[0].reason
    worker.handle(compiled_delivered(io))
    assert "g3" not in worker.records and _pool_free(worker)
