"""The prefill worker's loop: an engine in the prefill role, one record per request, KV pushed to decode.

It batches the prompts of many requests (chunked prefill, prefix cache: the
engine's scheduler), samples each one's first token, streams that token to
the router at once, tells the decode worker (FirstToken on its inbox), and
pushes the prompt's KV blocks into the blocks decode reserved, layer by layer
during the forward that completes the prompt. This object is the engine's KV
connector (`engine.kv_connector`): before that forward it opens the transfers,
and after each layer it hands the layer to the I/O thread, which sends it
while the next layers compute. Earlier chunks of a chunked prompt are already
in the cache and go out with it.

A decode worker of TP=b takes each of its ranks' KV heads straight from the
prefill rank holding them (`prefill_worker.pieces`): one request, several
transfers. Tensor parallel here (TP=a): this object is rank 0; the followers
run the forward loop and send their own heads (`prefill_worker.follower`),
told which requests a forward completes by the step broadcast's attachment.

Ownership: from `prefill` the request's blocks belong to the engine until the
step that samples its first token; from then on this worker holds them
(`engine.remote_kv`) and frees them once every transfer of the request has
ended, or, when it fails or is aborted, once every rank has let go of them
(`prefill_worker.records`). Nothing here waits for a peer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutput
from engine.remote_kv import add_prefill_request, release_blocks
from engine.scheduler import SchedulerOutput
from wire.codec import encode
from runtime.engine_bridge import prompt_phases, prompt_token_logprobs, sampling_params, token_logprobs
from kvtransfer.faults import TransportFaults
from wire.ranks import ShardOrder, ShardOrders, TransferEnded
from wire.requests import FirstToken, PrefillFailed, PrefillTask, TokenDelta, WorkerLoad
from wire.push_pull import Pushers
from prefill_worker.kv_sending import SendLayer, StartSend
from prefill_worker.pieces import transfers_of
from prefill_worker.records import Event, Phase, PrefillRecord
from runtime.control_service import Call
from runtime.load_board import LoadBoard, LoopSnapshot
from runtime.request_table import RequestTable
from runtime.transfer_service import Release
from runtime.worker_config import WorkerConfig

logger = logging.getLogger("tandem.prefill")


@dataclass(frozen=True)
class PrefillWorkerConfig(WorkerConfig):
    name: str = "prefill-0"
    transport_faults: TransportFaults = TransportFaults()  # fault-injection tests only


class PrefillWorker(RequestTable):
    events = Event

    def __init__(self, engine: LLMEngine, config: PrefillWorkerConfig, io, board: LoadBoard, pushers: Pushers,
                 control_address: str = "", *, deliver: Callable[[object], None]):  # fmt: skip
        """`io`: the I/O thread (anything with `post(command)`); the worker owns and closes it and `pushers`.
        `deliver`: posts to this worker's loop (`runtime.request_table`). `self.records`: request id ->
        PrefillRecord; `self.ranks`: tensor parallel, the follower ranks' senders."""
        super().__init__(engine, config, io, board, control_address, deliver=deliver)
        self.pushers, self.num_kv_heads = pushers, engine.config.model.num_kv_heads
        self._sending_now: tuple[str, ...] = ()  # requests whose transfers the forward under way feeds
        self.calls.update(prefill=self.prefill)
        engine.kv_connector = self

    # ---- the router's call ------------------------------------------------------
    def prefill(self, call: Call) -> None:
        """Queue the prompt (`_queue`); one whose grammar is not compiled yet waits for it off this thread first
        (COMPILING: `runtime.grammar_compiles`). A ValueError (nothing kept) if this engine cannot take it."""
        task: PrefillTask = call.arg
        rid, params = task.request.request_id, sampling_params(task.request.sampling)
        if rid in self.records:
            raise ValueError(f"request id {rid!r} is already in use")
        grammar = self.compiles.cached(params.structured)
        if params.structured is not None and grammar is None:
            if not self.start_compile(call, rid, params.structured):
                return None
            self.records[rid] = PrefillRecord(task, None, Phase.COMPILING, call=call)
            return None
        self._queue(call, task, params, grammar)

    def _queue(self, call: Call, task: PrefillTask, params, grammar) -> None:
        """`grammar`: `params.structured` compiled (None: none asked for)."""
        request = task.request
        req = add_prefill_request(self.engine, request.request_id, list(request.prompt_token_ids), params, grammar)
        req.suspect = request.suspect
        self.records[request.request_id] = PrefillRecord(task, req)
        self.window.queued(self.engine)
        call.answer(None)

    # ---- the KV connector (engine.kv_connector), on this thread inside engine.step ------
    def before_forward(self, sched: SchedulerOutput) -> bytes:
        """Open the transfers of every prompt this forward completes (its blocks are all allocated)."""
        orders = []
        for scheduled in sched.scheduled:
            record = self.records.get(scheduled.request.request_id)
            if scheduled.samples and record is not None and record.phase is Phase.QUEUED:
                orders.append(self._order(record))
                self.on(record.request_id, Event.SENDING)
        self._sending_now = tuple(order.request_id for order in orders)
        return encode(ShardOrders(tuple(orders))) if orders and self.ranks is not None else b""

    def save_layer(self, layer: int) -> None:
        if self._sending_now:
            self.io.post(SendLayer(self._sending_now, layer))

    # ---- the loop (runtime.loop.LoopWorker; sockets: runtime.request_table's) ---------
    def step(self) -> bool | None:
        try:
            outputs = self.engine_step()
        finally:
            self._sending_now = ()
        for out in outputs or ():
            self._hand_over(out)
        return True if outputs is not None else self.failed_step()

    def overdue(self, record: PrefillRecord) -> tuple[Event, str]:
        return Event.ACK_TIMEOUT, f"rank(s) {sorted(record.holders)} did not let go of it within " \
                                  f"{self.config.rank_ack_timeout_s}s"  # fmt: skip

    def snapshot(self) -> LoopSnapshot:
        kv, sched, meter = self.engine.kv_cache, self.engine.scheduler, self.engine.prefill_meter
        sending = sum(r.phase in (Phase.SENDING, Phase.RELEASING) for r in self.records.values())
        compiling = sum(r.phase is Phase.COMPILING for r in self.records.values())
        load = WorkerLoad(self.config.name, len(sched.waiting) + compiling, len(sched.running), sending,
                          kv.num_free_blocks, kv.pool.num_blocks, kv.pool.hit_rate,
                          prompt_tokens_advanced=meter.tokens, prompt_seconds=meter.seconds)  # fmt: skip
        return LoopSnapshot(load, not self.records, kv.num_free_blocks == kv.pool.num_blocks)

    def close(self) -> None:
        self.close_shared()
        for record in [r for r in self.records.values() if r.phase is Phase.COMPILING]:  # nothing queued yet
            record.call.answer(None, RuntimeError("prefill worker shut down"))
            del self.records[record.request_id]
        for record in list(self.records.values()):
            self.engine.abort_request(record.request_id)
        self.io.stop()  # nothing reads the held blocks after this
        for record in self.records.values():
            release_blocks(self.engine, record.request)
        self.records.clear()
        self.engine.shutdown()  # tensor parallel: the followers' forward loops end
        if self.ranks is not None:
            self.ranks.close()
        self.pushers.close()

    # ---- transitions (prefill_worker.records; the table below; `on` is runtime.request_table's) -------
    def _to_queued(self, record: PrefillRecord, event: Event, grammar=None, error: BaseException | None = None,
                   **_) -> None:  # fmt: skip
        """Its grammar is compiled: queued now, or refused (an invalid grammar: a ValueError, as ever)."""
        del self.records[record.request_id]  # `_queue` makes the record of what it queues
        if error is None:
            try:
                return self._queue(record.call, record.task, sampling_params(record.task.request.sampling), grammar)
            except Exception as err:  # inside a Call, `handle` would answer it so
                error = err
        record.call.answer(None, error)

    def _to_not_queued(self, record: PrefillRecord, event: Event, reason: str, **_) -> None:
        """Aborted while its grammar compiled: nothing was queued."""
        del self.records[record.request_id]
        record.call.answer(None, ValueError(f"request {record.request_id} ended before it was queued: {reason}"))

    def _to_sending(self, record: PrefillRecord, event: Event, **_) -> None:
        record.phase = Phase.SENDING

    def _to_dropped(self, record: PrefillRecord, event: Event, reason: str, **_) -> None:
        self.engine.abort_request(record.request_id)  # its blocks stay held for us: released just below
        self._gone(record, tell_decode=event is Event.STEP_FAILED, reason=reason)

    def _to_sent(self, record: PrefillRecord, event: Event, rank: int | None = None, peer: str = "", **_) -> None:
        record.transfers.discard((rank, peer))
        if not record.transfers:
            self._gone(record)

    def _to_releasing(self, record: PrefillRecord, event: Event, reason: str, **_) -> None:
        """Stop every rank's transfers; the blocks go back once each let go (`_to_released`)."""
        record.phase, record.reason = Phase.RELEASING, reason
        record.tell_decode = event is not Event.ABORT
        self.engine.abort_request(record.request_id)  # a no-op unless the failed step left it there
        self.start_release(record, Release(record.request_id, reason), reason)

    def _to_released(self, record: PrefillRecord, event: Event, reason: str, rank: int | None = None, **_) -> None:
        if self.let_go(record, event, reason, rank):
            self._gone(record, record.tell_decode, record.reason)

    P, E = Phase, Event
    transitions = {
        P.COMPILING: {E.GRAMMAR_COMPILED: _to_queued, E.ABORT: _to_not_queued},
        P.QUEUED: {E.SENDING: _to_sending, E.ABORT: _to_dropped, E.STEP_FAILED: _to_dropped},
        P.SENDING: {E.TRANSFER_DONE: _to_sent, E.TRANSFER_FAILED: _to_releasing, E.ABORT: _to_releasing,
                    E.STEP_FAILED: _to_releasing},
        P.RELEASING: {E.RELEASED: _to_released, E.ACK_TIMEOUT: _to_released},
    }
    del P, E

    # ---- helpers ----------------------------------------------------------------
    def _gone(self, record: PrefillRecord, tell_decode: bool = False, reason: str = "") -> None:
        """The request leaves this worker: its blocks back to the pool (still prefix-cached), decode told if asked."""
        release_blocks(self.engine, record.request)
        del self.records[record.request_id]
        if tell_decode:
            res = record.task.reservation
            self.pushers.send(res.inbox_address, PrefillFailed(record.request_id, reason, res.transfer_token))

    def _order(self, record: PrefillRecord) -> ShardOrder:
        res = record.task.reservation
        src = tuple(b.block_id for b in record.request.blocks[res.num_cached_blocks :])
        order = ShardOrder(record.request_id, src, res)
        try:
            record.transfers = transfers_of(order, self.num_kv_heads, self.tp_size)
        except ValueError:  # the reservation does not fit the plan: starting it reports the failure
            record.transfers = {(0, "")}
        self.io.post(StartSend(order))
        return order

    def _transfer_ended(self, ended: TransferEnded) -> None:
        """One (rank, decode address) transfer of a request ended, on this rank or a follower."""
        request_id, rank, peer = ended.request_id, ended.rank, ended.peer
        if ended.done:
            return self.on(request_id, Event.TRANSFER_DONE, rank=rank, peer=peer)
        logger.warning("KV transfer of %s from rank %d to %s %s: %s", request_id, rank, peer, ended.kind, ended.reason)
        self.on(request_id, Event.TRANSFER_FAILED,
                 f"KV transfer from prefill rank {rank} to {peer or 'decode'} {ended.kind}: {ended.reason}")  # fmt: skip

    def _hand_over(self, out: RequestOutput) -> None:
        """After the forward: the first token to the router's stream at once, and to decode's inbox."""
        record = self.records.get(out.request_id)
        if record is None:
            return
        request_id, token = out.request_id, out.new_token_ids[0]
        logprobs = token_logprobs(out.outputs[0].logprobs, 1)
        delta = TokenDelta(request_id, 0, (token,), logprobs=logprobs,
                           prompt_logprobs=prompt_token_logprobs(out.prompt_logprobs),
                           phases=prompt_phases(record.request))  # fmt: skip
        for piece in delta.in_pieces():  # a long prompt's logprobs take several frames
            self.pushers.send(record.task.request.stream_address, piece)
        res = record.task.reservation
        self.pushers.send(res.inbox_address, FirstToken(request_id, token, res.transfer_token))
