"""The decode worker: an engine in the decode role plus a KV receiver, streaming tokens over ZMQ.

A request arrives as `reserve()`: short uncached prompts (below
`local_prefill_threshold` tokens) are prefilled here like any engine request
(colocated mode); the rest get blocks reserved (prefix-cache hits kept, only
the missing blocks are transferred) and wait for their KV outside the running
batch. Once the receiver reports the KV landed and the prefill worker's
FirstToken is in the inbox, the request joins the continuous batch. Tokens
go out as `TokenDelta`s to the request's stream address; the first one, when
prefilled remotely, was already sent by the prefill worker.

Ownership: the engine owns the reserved blocks (`engine.remote_kv`); before
freeing a reservation this worker makes sure the receiver no longer writes
into it (`receiver.abort`, or its failed event). Not thread-safe: drive it
from one thread (`engine.step_loop.StepLoop`).

A KV transfer that fails (frames lost or late past the deadline, the sender
gone, the prefill worker's PrefillFailed) follows `kv_transfer_failure`:
"recompute" (default) frees the reservation and prefills the prompt here
(after the first token when its FirstToken came: the router has shown it
already), "fail" ends the request with an error delta. Requests whose router
stops calling (no reserve, abort or load for `router_lease_s`: it vanished)
are ended and their blocks freed.

Tensor parallel (engine tp_size n > 1): this object is rank 0. Each follower
rank runs the forward loop and, on an I/O thread, a `ShardReceiver` taking
its own KV heads into the same block ids (followers mirror rank 0's block
layout). `reserve()` tells every follower what to expect and returns only once
each acknowledged (`kvtransfer.rank_links`), so no chunk can arrive before its
reservation; a request is admitted once every rank's shard landed and the
FirstToken arrived. A failed shard ends the request on every rank, and its
blocks are freed only after each follower acknowledged dropping it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Literal

from decode_worker.recompute import requeue_locally
from engine.llm_engine import EngineArgs, EngineStepError, LLMEngine
from engine.outputs import RequestOutput
from engine.request import RequestStatus
from engine.remote_kv import (
    NoFreeBlocks,
    admit_remote_kv,
    count_uncached_tokens,
    fail_remote_kv,
    reserve_remote_kv,
    waiting_for_kv,
)
from kvtransfer.codec import decode
from kvtransfer.connector import TransferTimeouts
from kvtransfer.engine_bridge import kv_spec_for, sampling_params, token_logprobs
from kvtransfer.lease import LeaseTable
from kvtransfer.protocol import (
    DecodeReservation,
    DropShard,
    ExpectShard,
    FirstToken,
    GenerateRequest,
    PrefillFailed,
    RankEndpoint,
    ReserveRefused,
    TokenDelta,
    WorkerLoad,
)
from kvtransfer.rank_links import RankLinks, RankTimeout
from kvtransfer.receiver import KVReceiver
from kvtransfer.token_stream import PullSocket, Pushers

logger = logging.getLogger("tandem.decode")


@dataclass(frozen=True)
class DecodeWorkerConfig:
    name: str = "decode-0"
    kv_address: str = "tcp://127.0.0.1:0"
    inbox_address: str = "tcp://127.0.0.1:0"
    # Prompts with fewer uncached tokens than this are prefilled here (0: never; a huge value: colocated mode).
    local_prefill_threshold: int = 0
    timeouts: TransferTimeouts = TransferTimeouts()
    # Tensor parallel: rank 0 and the followers bind their control sockets here (keep port 0);
    # rank 0 waits this long for every follower to acknowledge a reservation or a drop.
    control_address: str = "tcp://127.0.0.1:0"
    rank_ack_timeout_s: float = 10.0
    kv_transfer_failure: Literal["recompute", "fail"] = "recompute"
    router_lease_s: float = 60.0  # no control call for this long: the router is gone, end what we hold


class DecodeWorker:
    def __init__(self, engine_args: EngineArgs, config: DecodeWorkerConfig = DecodeWorkerConfig()):
        self.config = config
        self.engine = LLMEngine.from_args(engine_args, show_progress=False)
        spec, self.tp_size = kv_spec_for(self.engine.config), self.engine.config.parallel.tp_size
        self.receiver = KVReceiver(
            self.engine.runner.kv_caches, spec, config.kv_address, self.tp_size, 0, timeouts=config.timeouts
        )
        self.ranks: RankLinks | None = None  # tensor parallel: the follower ranks' shard receivers
        self._shards_missing: dict[str, set[int]] = {}  # request id -> follower ranks whose shard has not landed
        self.inbox = PullSocket((FirstToken, PrefillFailed), config.inbox_address)
        self.pushers = Pushers()
        self._stream_of: dict[str, str] = {}  # request id -> token stream address
        self._kv_landed: dict[str, float] = {}  # request id -> when its KV landed (monotonic)
        self._first_token: dict[str, int] = {}
        self._recomputing: dict[str, int] = {}  # request id -> tokens already streamed before its local prefill
        self._router_lease = LeaseTable(config.router_lease_s)
        self._router_lease.grant("router")

    # ---- control ----------------------------------------------------------
    def attach_followers(self, endpoints: list[bytes]) -> None:
        """Tensor parallel: reach the follower ranks' shard receivers (`RankEndpoint`s, encoded)."""
        ranks = [decode(e, RankEndpoint) for e in endpoints]
        if sorted(r.rank for r in ranks) != list(range(1, self.tp_size)):
            raise ValueError(f"expected endpoints of ranks 1..{self.tp_size - 1}, got {[r.rank for r in ranks]}")
        self.ranks = RankLinks(ranks, self.config.rank_ack_timeout_s, self.config.control_address)

    def reserve(self, request: GenerateRequest) -> DecodeReservation | ReserveRefused:
        """Take the request: prefill it here, or reserve blocks for KV from a prefill worker."""
        request_id, prompt = request.request_id, list(request.prompt_token_ids)
        self._router_lease.grant("router")
        if self.tp_size > 1 and self.ranks is None:
            return ReserveRefused(request_id, "decode worker is starting: its follower ranks are not attached", True)
        try:
            params = sampling_params(request.sampling)
            if request.local_prefill or count_uncached_tokens(self.engine, prompt) < self.config.local_prefill_threshold:
                self.engine.add_request(request_id, prompt, params)
                self._stream_of[request_id] = request.stream_address
                return DecodeReservation(request_id, prefill_locally=True)
            res = reserve_remote_kv(self.engine, request_id, prompt, params)
        except NoFreeBlocks as err:
            return ReserveRefused(request_id, str(err), retryable=True)
        except ValueError as err:
            return ReserveRefused(request_id, str(err), retryable=False)
        self.receiver.recv(request_id, res.transfer_block_ids)
        try:
            self._expect_shards(request_id, res.transfer_block_ids)
        except RankTimeout as err:
            self.receiver.abort(request_id, str(err))
            self.ranks.tell(DropShard(request_id, str(err)))  # a late ExpectShard is dropped right after
            fail_remote_kv(self.engine, request_id)
            return ReserveRefused(request_id, str(err), retryable=False)
        self._stream_of[request_id] = request.stream_address
        return DecodeReservation(
            request_id, False, self.receiver.address, self.inbox.address, res.transfer_block_ids,
            res.num_cached_blocks, self._kv_addresses(), self.tp_size,
        )  # fmt: skip

    def abort(self, request_id: str) -> None:
        self._router_lease.grant("router")
        self._end_with_error(request_id, "aborted by the client")

    def load(self) -> WorkerLoad:
        self._router_lease.grant("router")
        kv, sched, received = self.engine.kv_cache, self.engine.scheduler, self.receiver.stats
        return WorkerLoad(
            self.config.name, len(sched.waiting) + len(waiting_for_kv(self.engine)), len(sched.running),
            len(self.receiver.pending()), kv.num_free_blocks, kv.pool.num_blocks, kv.pool.hit_rate,
            received.transfers_completed, received.transfer_bytes, received.transfer_seconds,
        )  # fmt: skip

    def is_idle(self) -> bool:
        return not self.engine.requests and not self.receiver.pending() and not self._shards_missing

    def pool_all_free(self) -> bool:
        return self.engine.kv_cache.num_free_blocks == self.engine.kv_cache.pool.num_blocks

    # ---- the loop ---------------------------------------------------------
    def step(self) -> bool:
        """Land KV, read first tokens, admit what is complete, run one decode step, stream its tokens."""
        for msg in self.inbox.poll(0):  # before the receiver's events: a failed transfer's first token is known
            if msg.request_id in self._recomputing:
                continue  # prefilled here instead: the prefill worker's news no longer matter
            if isinstance(msg, FirstToken):
                if msg.request_id in self.engine.requests:
                    self._first_token[msg.request_id] = msg.token_id
            else:
                self._transfer_failed(msg.request_id, f"prefill failed: {msg.reason}")
        for event in self.receiver.poll(0):
            if event.kind == "done":
                self._kv_landed[event.request_id] = time.monotonic()
            else:
                self._transfer_failed(event.request_id, f"KV transfer failed: {event.reason}")
        if self._router_lease.pop_expired():
            self._end_all(f"no call from the router for {self.config.router_lease_s}s")
        self._poll_shards()
        room = self.engine.config.scheduler.max_num_seqs - len(self.engine.scheduler.running)
        ready = [r for r in self._first_token if r in self._kv_landed and not self._shards_missing.get(r)]
        for request_id in ready[: max(room, 0)]:
            self._admit(request_id)  # oldest first (dict order); the rest wait for a free seat in the batch
        self._expire_missing_first_tokens()
        if not self.engine.has_unfinished_requests():
            return False
        try:
            outputs = self.engine.step()
        except EngineStepError as err:
            for request_id in err.request_ids:
                self._end_with_error(request_id, str(err))
            return True
        for out in outputs:
            self._stream(out)
        return True

    def close(self) -> None:
        self._end_all("decode worker shut down")
        self.engine.shutdown()  # tensor parallel: the followers' forward loops end
        if self.ranks is not None:
            self.ranks.close()
        self.receiver.close()
        self.inbox.close()
        self.pushers.close()

    # ---- the follower ranks' shards ----------------------------------------
    def _kv_addresses(self) -> tuple[str, ...]:
        if self.ranks is None:
            return ()
        return (self.receiver.address, *(self.ranks.endpoints[r].kv_address for r in self.ranks.ranks))

    def _expect_shards(self, request_id: str, block_ids) -> None:
        if self.ranks is not None:
            self.ranks.call(ExpectShard(request_id, tuple(block_ids)))
            self._shards_missing[request_id] = set(self.ranks.ranks)

    def _poll_shards(self) -> None:
        for report in self.ranks.poll() if self.ranks is not None else ():
            missing = self._shards_missing.get(report.request_id)
            if missing is None:
                continue  # ended already (a late report)
            if report.kind == "done":
                missing.discard(report.rank)
            else:
                self._transfer_failed(report.request_id, f"KV transfer to rank {report.rank} failed: {report.reason}")

    # ---- admission and streaming ------------------------------------------
    def _admit(self, request_id: str) -> None:
        del self._kv_landed[request_id]
        self._shards_missing.pop(request_id, None)
        token = self._first_token.pop(request_id)
        self._stream(admit_remote_kv(self.engine, request_id, token), already_streamed=1)

    def _expire_missing_first_tokens(self) -> None:
        """KV landed but the prefill worker's FirstToken never came (it died between the two): give up."""
        deadline = time.monotonic() - self.config.timeouts.transfer_s
        overdue = [r for r, landed in self._kv_landed.items() if landed < deadline and r not in self._first_token]
        for request_id in overdue:
            self._end_with_error(request_id, f"no first token {self.config.timeouts.transfer_s}s after the KV landed")

    def _stream(self, out: RequestOutput, already_streamed: int = 0) -> None:
        completion = out.outputs[0]
        new = out.new_token_ids[already_streamed:]
        if not new and not out.finished:
            return
        delta = TokenDelta(
            out.request_id,
            len(completion.token_ids) - len(new),
            tuple(new),
            out.finished,
            completion.finish_reason,
            len(out.prompt_token_ids),
            len(completion.token_ids),
            out.num_cached_tokens,
            logprobs=token_logprobs(completion.logprobs, len(new)),
        )
        self._send(delta)

    def _end_with_error(self, request_id: str, reason: str) -> None:
        """End the request wherever it is (waiting for KV, running, already gone) and free its blocks."""
        req = self._drop(request_id, reason)
        if req is None:
            self._stream_of.pop(request_id, None)
            self._recomputing.pop(request_id, None)
            return
        n_out = len(req.output_token_ids)
        self._send(TokenDelta(request_id, n_out, (), True, "abort", req.num_prompt_tokens, n_out,
                              req.num_cached_tokens, reason))  # fmt: skip

    def _end_all(self, reason: str) -> None:
        for request_id in list(self.engine.requests):
            self._end_with_error(request_id, reason)

    def _drop(self, request_id: str, reason: str):
        """Stop every write into the request's blocks and free them; return the engine's request (None if gone)."""
        req = self.engine.requests.get(request_id)
        if request_id in self.receiver.pending():
            self.receiver.abort(request_id, reason)  # no write into its blocks after this
        if self._shards_missing.pop(request_id, None) is not None:
            self.ranks.drop(request_id, reason)  # no follower writes into its blocks after this
        self._kv_landed.pop(request_id, None)
        self._first_token.pop(request_id, None)
        if req is not None:
            fail_remote_kv(self.engine, request_id)
        return req

    def _transfer_failed(self, request_id: str, reason: str) -> None:
        """The request's KV will not come: prefill it here ("recompute") or end it with an error ("fail")."""
        req = self.engine.requests.get(request_id)
        waiting = req is not None and req.status == RequestStatus.WAITING_FOR_KV  # running: its KV is all here
        if self.config.kv_transfer_failure == "fail" or not waiting or request_id in self._recomputing:
            self._end_with_error(request_id, reason)
            return
        first = self._first_token.get(request_id)
        self._drop(request_id, reason)
        logger.warning("%s: recomputing the prompt here (%s)", request_id, reason)
        try:
            spliced, finish_reason = requeue_locally(self.engine, req, first)
        except ValueError as err:
            finish_reason, reason = "abort", f"{reason}; recomputing failed: {err}"
            spliced = 0 if first is None else 1
        if finish_reason is None:
            self._recomputing[request_id] = spliced
            return
        self._send(TokenDelta(request_id, spliced, (), True, finish_reason, req.num_prompt_tokens, spliced,
                              error=reason if finish_reason == "abort" else ""))  # fmt: skip

    def _send(self, delta: TokenDelta) -> None:
        spliced = self._recomputing.get(delta.request_id, 0)
        if spliced:  # recomputed after its first token: numbered as the whole request
            delta = dataclasses.replace(
                delta, first_index=delta.first_index + spliced, num_prompt_tokens=delta.num_prompt_tokens - spliced,
                num_output_tokens=delta.num_output_tokens + spliced,
            )  # fmt: skip
        address = self._stream_of.get(delta.request_id)
        if address is not None:
            self.pushers.send(address, delta)
        if delta.finished:
            self._stream_of.pop(delta.request_id, None)
            self._recomputing.pop(delta.request_id, None)
