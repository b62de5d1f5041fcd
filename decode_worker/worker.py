"""The decode worker's loop: an engine in the decode role, one record per request, tokens streamed over ZMQ.

A request arrives as a `reserve` call. Short uncached prompts (below
`local_prefill_threshold` tokens), and any the router sends with
`local_prefill` (no prefill worker could take it), are prefilled here like any
engine request; the rest get blocks reserved (prefix-cache hits kept, only the
missing blocks are transferred) and wait in the scheduler's `waiting_for_kv`
queue, outside the running batch. Once the KV has landed on every rank and
the prefill worker's FirstToken is in the inbox, the request joins the
batch. Tokens go out as `TokenDelta`s to the request's stream address; the
first one, when prefilled remotely, was already sent by the prefill worker.

Threads: this object lives on the worker's loop thread (`runtime.loop`); the
KV receiver lives on its I/O thread (`decode_worker.kv_receiving`), which
also answers heartbeats. They meet only through typed messages. Ownership:
the engine owns the reserved blocks (`engine.remote_kv`); before they are
freed every rank that may write them has acknowledged the release
(`decode_worker.records`: the RELEASING phase). Nothing here waits for a
peer: tensor-parallel acks and releases are phases, not blocking calls.

A KV transfer that fails (frames lost or late past the deadline, the sender
gone, the prefill worker's PrefillFailed) follows `kv_transfer_failure`:
"recompute" (default) prefills the prompt here (after the first token when
its FirstToken came: the router has shown it already), "fail" ends the
request with an error delta. When the router stops calling (no call for
`router_lease_s`: it vanished) every request ends and its blocks are freed.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Callable, Literal

from decode_worker.kv_receiving import AnswerAfter, ExpectKV
from decode_worker.recompute import requeue_locally
from decode_worker.records import DecodeRecord, Event, Phase
from decode_worker.streaming import final_delta, output_delta
from engine.llm_engine import LLMEngine
from engine.remote_kv import NoFreeBlocks, admit_remote_kv, count_uncached_tokens, fail_remote_kv, reserve_remote_kv
from runtime.engine_bridge import decode_phases, sampling_params
from wire.ranks import ExpectShard, TransferEnded
from wire.requests import DecodeReservation, FirstToken, GenerateRequest, PrefillFailed, ReserveRefused, WorkerLoad
from wire.push_pull import PullSocket, Pushers
from wire.socket_security import holds_token, refuse, transfer_token
from runtime.control_service import Call
from runtime.load_board import LoadBoard, LoopSnapshot
from runtime.request_table import RequestTable
from runtime.transfer_service import Release
from runtime.worker_config import WorkerConfig

logger = logging.getLogger("tandem.decode")


@dataclass(frozen=True)
class DecodeWorkerConfig(WorkerConfig):
    name: str = "decode-0"
    # Prompts with fewer uncached tokens than this are prefilled here (0: never; a huge value: colocated mode).
    local_prefill_threshold: int = 0
    kv_transfer_failure: Literal["recompute", "fail"] = "recompute"


class DecodeWorker(RequestTable):
    events = Event

    def __init__(self, engine: LLMEngine, config: DecodeWorkerConfig, io, board: LoadBoard, receiver_address: str,
                 inbox: PullSocket, pushers: Pushers, control_address: str = "", *,
                 deliver: Callable[[object], None]):  # fmt: skip
        """`io`: the I/O thread (anything with `post(command)`); the worker owns and closes it, `inbox`, `pushers`.
        `deliver`: posts to this worker's loop (`runtime.request_table`). `self.records`: request id ->
        DecodeRecord, oldest first (admission order); `self.ranks`: tensor parallel, the follower ranks' receivers."""
        super().__init__(engine, config, io, board, control_address, deliver=deliver)
        self.receiver_address, self.inbox, self.pushers = receiver_address, inbox, pushers
        self.calls.update(reserve=self.reserve)

    # ---- the router's call ------------------------------------------------------
    def reserve(self, call: Call) -> None:
        """Take the request (`_take`); one whose grammar is not compiled yet waits for it off this thread
        first (COMPILING: `runtime.grammar_compiles`)."""
        request: GenerateRequest = call.arg
        rid = request.request_id
        if self.tp_size > 1 and self.ranks is None:
            return call.answer(ReserveRefused(rid, "decode worker is starting: its follower ranks are not attached",
                                              True))  # fmt: skip
        try:
            params = sampling_params(request.sampling)
            if rid in self.records:
                raise ValueError(f"request id {rid!r} is already in use")
        except ValueError as err:
            return call.answer(ReserveRefused(rid, str(err), retryable=False))
        grammar = self.compiles.cached(params.structured)
        if params.structured is not None and grammar is None:
            if not self.start_compile(call, rid, params.structured):
                return None
            self.records[rid] = DecodeRecord(rid, request.stream_address, len(request.prompt_token_ids),
                                             Phase.COMPILING, call, asked=request)  # fmt: skip
            return None
        self._take(call, request, params, grammar)

    def _take(self, call: Call, request: GenerateRequest, params, grammar) -> None:
        """Prefill it here, or reserve blocks for its KV (answered once every rank expects it). `grammar`:
        `params.structured` compiled (None: none asked for)."""
        rid, prompt = request.request_id, list(request.prompt_token_ids)
        try:
            if request.local_prefill or (count_uncached_tokens(self.engine, prompt, params.cache_salt)
                                         < self.config.local_prefill_threshold):  # fmt: skip
                self.engine.add_request(rid, prompt, params, grammar)
                self.engine.requests[rid].suspect = request.suspect
                self.window.queued(self.engine)
                self.records[rid] = DecodeRecord(rid, request.stream_address, len(prompt), Phase.RUNNING,
                                                 request=self.engine.requests[rid])  # fmt: skip
                return call.answer(DecodeReservation(rid, prefill_locally=True))
            res = reserve_remote_kv(self.engine, rid, prompt, params, grammar)
            self.engine.requests[rid].suspect = request.suspect
        except NoFreeBlocks as err:
            return call.answer(ReserveRefused(rid, str(err), retryable=True))
        except ValueError as err:
            return call.answer(ReserveRefused(rid, str(err), retryable=False))
        blocks, token = res.transfer_block_ids, transfer_token()
        self.io.post(ExpectKV(rid, blocks, token))  # before any answer: expected before anyone knows where
        reservation = DecodeReservation(rid, False, self.receiver_address, self.inbox.address, blocks,
                                        res.num_cached_blocks, self._kv_addresses(), self.tp_size, token)  # fmt: skip
        record = DecodeRecord(rid, request.stream_address, len(prompt), Phase.AWAITING_KV, call, reservation,
                              request=self.engine.requests[rid])  # fmt: skip
        self.records[rid] = record
        if self.ranks is None:
            return self._answer_reserve(record)
        record.phase, record.deadline = Phase.EXPECTING_SHARDS, time.monotonic() + self.config.rank_ack_timeout_s
        record.unacked, record.shards_missing = set(self.ranks.ranks), set(self.ranks.ranks)
        self.ranks.tell(ExpectShard(rid, blocks, token))

    # ---- the loop (runtime.loop.LoopWorker) -------------------------------------
    def sockets(self) -> list:
        return [self.inbox.socket, *super().sockets()]

    def read_sockets(self) -> None:
        for msg in self.inbox.poll(0):
            if not self._from_its_prefill(msg):
                continue
            if isinstance(msg, FirstToken):
                self.on(msg.request_id, Event.FIRST_TOKEN, token=msg.token_id)
            else:  # PrefillFailed
                self.on(msg.request_id, Event.KV_FAILED, f"prefill failed: {msg.reason}")
        super().read_sockets()  # the follower ranks' acks and transfer reports
        self._admit_ready()

    def _from_its_prefill(self, msg: FirstToken | PrefillFailed) -> bool:
        """Whether `msg` comes from the prefill worker its request went to: only it (and the router) learnt the
        reservation's transfer token. Another member's is dropped and counted, the request untouched."""
        record = self.records.get(msg.request_id)
        token = record.reservation.transfer_token if record is not None and record.reservation is not None else ""
        if not holds_token(token, msg.transfer_token):
            refuse("inbox", "wrong_transfer_token", f"a {type(msg).__name__} of {msg.request_id}")
            return False
        return True

    def step(self) -> bool | None:
        outputs = self.engine_step()
        if outputs is None:
            return self.failed_step()
        for out in outputs:
            record = self.records.get(out.request_id)
            if record is not None:
                self._stream(record, out)
                if out.finished:
                    self.on(out.request_id, Event.FINISHED)
        self._admit_ready()  # seats freed by finished requests
        return True

    def overdue(self, record: DecodeRecord) -> tuple[Event, str]:
        if record.phase is Phase.AWAITING_KV:
            return Event.NO_FIRST_TOKEN, f"no first token {self.config.timeouts.transfer_s}s after the KV landed"
        missing = sorted(record.unacked if record.phase is Phase.EXPECTING_SHARDS else record.holders)
        return Event.ACK_TIMEOUT, f"tensor-parallel rank(s) {missing} did not acknowledge {record.request_id!r} " \
                                  f"within {self.config.rank_ack_timeout_s}s"  # fmt: skip

    def snapshot(self) -> LoopSnapshot:
        kv, sched, meter = self.engine.kv_cache, self.engine.scheduler, self.engine.prefill_meter
        awaiting = sum(r.phase in (Phase.EXPECTING_SHARDS, Phase.AWAITING_KV) for r in self.records.values())
        compiling = sum(r.phase is Phase.COMPILING for r in self.records.values())  # queued for their grammar
        waiting = len(sched.waiting) + len(sched.waiting_for_kv) + compiling
        load = WorkerLoad(self.config.name, waiting, len(sched.running),
                          awaiting, kv.num_free_blocks, kv.pool.num_blocks, kv.pool.hit_rate,
                          prompt_tokens_advanced=meter.tokens, prompt_seconds=meter.seconds)  # fmt: skip
        idle = not self.records and not self.engine.requests
        return LoopSnapshot(load, idle, kv.num_free_blocks == kv.pool.num_blocks)

    def close(self) -> None:
        self.close_shared()
        for record in list(self.records.values()):
            if record.phase is Phase.COMPILING:  # not taken: its reserve is refused, its client saw nothing
                record.call.answer(ReserveRefused(record.request_id, "decode worker shut down", retryable=True))
                continue
            self.engine.abort_request(record.request_id)
            self._end_stream(record, "decode worker shut down")
        self.records.clear()
        self.io.stop()  # the receiver writes nothing after this
        self.engine.shutdown()  # tensor parallel: the followers' forward loops end
        for closable in (self.ranks, self.inbox, self.pushers):
            if closable is not None:
                closable.close()

    # ---- transitions (decode_worker.records; the table below; `on` is runtime.request_table's) --------
    def _to_taken(self, record: DecodeRecord, event: Event, grammar=None, error: BaseException | None = None,
                  **_) -> None:  # fmt: skip
        """Its grammar is compiled: the reserve is taken now, or refused as an invalid grammar always was."""
        del self.records[record.request_id]  # `_take` makes the record of what it takes
        call, request = record.call, record.asked
        if error is None:
            try:
                return self._take(call, request, sampling_params(request.sampling), grammar)
            except Exception as err:  # a bug: the router hears of it (inside a Call, `handle` would do this)
                error = err
        if isinstance(error, ValueError):  # GrammarError: the request's fault
            return call.answer(ReserveRefused(record.request_id, str(error), retryable=False))
        call.answer(None, error)

    def _to_not_taken(self, record: DecodeRecord, event: Event, reason: str, **_) -> None:
        """Aborted while its grammar compiled: nothing was reserved, the reserve is refused."""
        del self.records[record.request_id]
        record.call.answer(ReserveRefused(record.request_id, reason, retryable=False))

    def _to_awaiting_kv(self, record: DecodeRecord, event: Event, rank: int | None = None, **_) -> None:
        record.unacked.discard(rank)
        if not record.unacked:
            record.phase, record.deadline = Phase.AWAITING_KV, None
            self._answer_reserve(record)

    def _to_refused(self, record: DecodeRecord, event: Event, reason: str, **_) -> None:
        record.call.answer(ReserveRefused(record.request_id, reason, retryable=False))
        record.call = None
        self._release(record, "refused", reason)

    def _to_admission(self, record: DecodeRecord, event: Event, token: int | None = None, rank: int | None = None,
                      **_) -> None:  # fmt: skip
        if event is not Event.FIRST_TOKEN:
            record.kv_landed_at = self.engine.clock()
        if event is Event.KV_DONE:
            record.kv_landed = True
            if record.first_token is None:  # the prefill worker sends both at once; give the token time to come
                record.deadline = time.monotonic() + self.config.timeouts.transfer_s
        elif event is Event.SHARD_DONE:
            record.shards_missing.discard(rank)
        else:
            record.first_token, record.deadline = token, None
            record.first_token_seen = self.engine.clock()

    def _to_running(self, record: DecodeRecord, event: Event, **_) -> None:
        """Ready (its KV on every rank and its first token here): it takes a seat in the batch, if there is one."""
        if not record.ready:
            return
        admitted_at = self.engine.clock()
        out = admit_remote_kv(self.engine, record.request_id, record.first_token)
        if out is None:
            return
        record.phase, record.deadline, record.admitted_at = Phase.RUNNING, None, admitted_at
        self._stream(record, out, already_streamed=1)
        if out.finished:
            self.on(record.request_id, Event.FINISHED)

    def _to_recompute_or_end(self, record: DecodeRecord, event: Event, reason: str, **_) -> None:
        self._release(record, "recompute" if self.config.kv_transfer_failure == "recompute" else "end", reason)

    def _to_end(self, record: DecodeRecord, event: Event, reason: str, **_) -> None:
        if record.phase is not Phase.RUNNING:
            return self._release(record, "end", reason)
        self.engine.abort_request(record.request_id)  # frees its blocks (a no-op after a failed step)
        # A failed step is this worker's trouble, not the request's: the router resumes it elsewhere.
        self._end_stream(record, reason, resumable=event is Event.STEP_FAILED)
        del self.records[record.request_id]

    def _to_gone(self, record: DecodeRecord, event: Event, **_) -> None:
        del self.records[record.request_id]

    def _to_released(self, record: DecodeRecord, event: Event, reason: str, rank: int | None = None, **_) -> None:
        if not self.let_go(record, event, reason, rank):
            return
        req = self.engine.requests.get(record.request_id)
        fail_remote_kv(self.engine, record.request_id)  # nobody writes its blocks now: back to the pool
        if record.then == "recompute" and req is not None:
            return self._recompute(record, req)
        if record.then != "refused":  # a refused reserve was never shown to the client
            self._end_stream(record, record.reason)
        del self.records[record.request_id]

    A, E = Phase, Event
    transitions = {
        A.COMPILING: {E.GRAMMAR_COMPILED: _to_taken, E.ABORT: _to_not_taken},
        A.EXPECTING_SHARDS: {E.RANK_ACKED: _to_awaiting_kv, E.ACK_TIMEOUT: _to_refused, E.ABORT: _to_refused},
        A.AWAITING_KV: {E.KV_DONE: _to_admission, E.SHARD_DONE: _to_admission, E.FIRST_TOKEN: _to_admission,
                        E.SEAT_OFFERED: _to_running, E.KV_FAILED: _to_recompute_or_end, E.NO_FIRST_TOKEN: _to_end,
                        E.ABORT: _to_end},
        A.RUNNING: {E.ABORT: _to_end, E.STEP_FAILED: _to_end, E.FINISHED: _to_gone},
        A.RELEASING: {E.RELEASED: _to_released, E.ACK_TIMEOUT: _to_released},
    }
    del A, E

    # ---- helpers ----------------------------------------------------------------
    def _release(self, record: DecodeRecord, then: str, reason: str) -> None:
        """Ask everyone who may still write the request's blocks to let go (RELEASING), then `then`."""
        record.phase, record.then, record.reason = Phase.RELEASING, then, reason
        self.start_release(record, Release(record.request_id, reason), reason)

    def _recompute(self, record: DecodeRecord, req) -> None:
        logger.warning("%s: recomputing the prompt here (%s)", record.request_id, record.reason)
        try:
            record.spliced, finish_reason = requeue_locally(self.engine, req, record.first_token)
            record.request, record.admitted_at = self.engine.requests.get(record.request_id), None
        except ValueError as err:
            record.reason, finish_reason = f"{record.reason}; recomputing failed: {err}", "abort"
            record.spliced = int(record.first_token is not None)
        if finish_reason is None:
            record.phase, record.deadline = Phase.RUNNING, None
            return
        record.num_output = record.spliced
        self._end_stream(record, record.reason, finish_reason)
        del self.records[record.request_id]

    def _admit_ready(self) -> None:
        for record in [r for r in self.records.values() if r.phase is Phase.AWAITING_KV and r.ready]:
            self.on(record.request_id, Event.SEAT_OFFERED)
            if record.phase is Phase.AWAITING_KV:
                return  # no seat in the batch: the oldest waits first

    def _transfer_ended(self, ended: TransferEnded) -> None:
        """This rank's receiver (rank 0: the whole prompt) or a follower's (its heads) ended the transfer."""
        if ended.done:
            return self.on(ended.request_id, Event.KV_DONE if ended.rank == 0 else Event.SHARD_DONE, rank=ended.rank)
        where = f" to rank {ended.rank}" if ended.rank else ""
        self.on(ended.request_id, Event.KV_FAILED, f"KV transfer{where} failed: {ended.reason}")

    def _answer_reserve(self, record: DecodeRecord) -> None:
        # Through the I/O thread: it has applied ExpectKV before the answer leaves.
        self.io.post(AnswerAfter(record.call.answer, record.reservation))
        record.call = None

    def _kv_addresses(self) -> tuple[str, ...]:
        if self.ranks is None:
            return ()
        return (self.receiver_address, *(self.ranks.endpoints[r].kv_address for r in self.ranks.ranks))

    def _stream(self, record: DecodeRecord, out, already_streamed: int = 0) -> None:
        delta = output_delta(out, already_streamed)
        if delta is not None:
            delta = delta.shifted(record.spliced)
            if delta.finished and record.request is not None:
                delta = dataclasses.replace(delta, phases=decode_phases(record.request, record.first_token_seen,
                                                                        record.kv_landed_at, record.admitted_at))  # fmt: skip
            record.num_output = delta.first_index + len(delta.token_ids)
            for piece in delta.in_pieces():  # a long prompt's logprobs take several frames
                self.pushers.send(record.stream_address, piece)

    def _end_stream(self, record: DecodeRecord, reason: str, finish_reason: str = "abort",
                    resumable: bool = False) -> None:  # fmt: skip
        error = reason if finish_reason == "abort" else ""
        self.pushers.send(record.stream_address, final_delta(record, finish_reason, error, resumable))
