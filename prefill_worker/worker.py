"""The prefill worker: an engine in the prefill role plus a KV sender.

It batches the prompts of many requests (chunked prefill, prefix cache: the
engine's scheduler), samples each one's first token, streams that token to
the router at once, tells the decode worker (FirstToken on its inbox), and
pushes the prompt's KV blocks into the blocks decode reserved, layer by layer
during the forward that completes the prompt: the transfer starts before that
forward (`engine.before_forward`) and each layer goes out as soon as its
attention has written it (`engine.layer_hook`), while the next layers compute.
Earlier chunks of a chunked prompt are already in the cache and go out with it.

A decode worker of TP=b takes each of its ranks' KV heads straight from the
prefill rank holding them (`prefill_worker.pieces`): one request, several
transfers. Tensor parallel here (TP=a): this object is rank 0; the followers
run the forward loop and send their own heads (`ShardSender`), told which
requests a forward completes by the step broadcast's attachment.

Ownership: from `prefill()` the request's blocks belong to the engine until
the step that samples its first token; from then on this worker holds them
(`engine.remote_kv`) and frees them once every transfer of the request has
ended (ours from `sender.poll()`, the followers' from their `ShardEnded`
reports), on abort, or at once if the transfer could not start. A transfer
that fails or expires fails the request: the other transfers are aborted and
decode is told (PrefillFailed). Not thread-safe: drive it from one thread
(`engine.step_loop.StepLoop`).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass

from engine.layer_hook import install_layer_hook
from engine.llm_engine import EngineArgs, EngineStepError, LLMEngine
from engine.outputs import RequestOutput
from engine.remote_kv import add_prefill_request, release_blocks
from engine.request import Request
from engine.scheduler import SchedulerOutput
from kvtransfer.codec import decode, encode
from kvtransfer.connector import TransferTimeouts
from kvtransfer.engine_bridge import kv_spec_for, sampling_params, token_logprobs
from kvtransfer.faults import TransportFaults
from kvtransfer.lease import LeaseTable
from kvtransfer.protocol import (
    FirstToken,
    IncompatiblePeerError,
    PrefillFailed,
    PrefillTask,
    RankEndpoint,
    ShardOrder,
    ShardOrders,
    TokenDelta,
    WorkerLoad,
)
from kvtransfer.rank_links import RankLinks
from kvtransfer.sender import KVSender
from kvtransfer.token_stream import Pushers
from prefill_worker.pieces import start_pieces, transfers_of

logger = logging.getLogger("tandem.prefill")


@dataclass(frozen=True)
class PrefillWorkerConfig:
    name: str = "prefill-0"
    timeouts: TransferTimeouts = TransferTimeouts()
    control_address: str = "tcp://127.0.0.1:0"  # tensor parallel: rank 0's and the followers' (keep port 0)
    router_lease_s: float = 60.0  # no control call for this long: the router is gone, drop what we hold
    transport_faults: TransportFaults = TransportFaults()  # fault-injection tests only


class PrefillWorker:
    def __init__(self, engine_args: EngineArgs, config: PrefillWorkerConfig = PrefillWorkerConfig()):
        self.config = config
        self.engine = LLMEngine.from_args(engine_args, skip_tokenizer_init=True, show_progress=False)
        self.tp_size, self.num_kv_heads = self.engine.config.parallel.tp_size, self.engine.config.model.num_kv_heads
        spec = kv_spec_for(self.engine.config)
        self.sender = KVSender(spec, config.name, self.tp_size, 0, timeouts=config.timeouts,
                               faults=config.transport_faults)  # fmt: skip
        self._router_lease = LeaseTable(config.router_lease_s)
        self._router_lease.grant("router")
        self.pushers = Pushers()
        self.ranks: RankLinks | None = None  # tensor parallel: the follower ranks' shard senders
        self._tasks: dict[str, PrefillTask] = {}
        self._held: dict[str, Request] = {}  # computing or transferring: blocks to release
        self._transferring: dict[str, set[tuple[int, str]]] = {}  # request id -> (rank, address) still sending
        self.transfers_ended: Counter[str] = Counter()  # "done" / "failed" / "expired", for metrics
        self._sending_now: list[str] = []  # transfers started for the forward under way
        self._start_failed: dict[str, str] = {}  # request id -> why its transfer could not start
        self.engine.before_forward = self._start_transfers
        install_layer_hook(self.engine.runner, self._send_layer)

    # ---- control ----------------------------------------------------------
    def attach_followers(self, endpoints: list[bytes]) -> None:
        """Tensor parallel: reach the follower ranks' shard senders (`RankEndpoint`s, encoded)."""
        self.ranks = RankLinks([decode(e, RankEndpoint) for e in endpoints], address=self.config.control_address)

    def prefill(self, task: PrefillTask) -> None:
        """Queue the prompt; raises ValueError (nothing kept) if this engine cannot take it."""
        self._router_lease.grant("router")
        request = task.request
        params = sampling_params(request.sampling)
        req = add_prefill_request(self.engine, request.request_id, list(request.prompt_token_ids), params)
        self._tasks[request.request_id] = task
        self._held[request.request_id] = req

    def abort(self, request_id: str) -> None:
        self._router_lease.grant("router")
        self._drop(request_id, "aborted by the client")

    def _drop(self, request_id: str, reason: str) -> None:
        if request_id in self._transferring:
            self._abort_transfers(request_id, reason)
        elif request_id in self._held:
            self.engine.abort_request(request_id)
        self._release(request_id)

    def load(self) -> WorkerLoad:
        self._router_lease.grant("router")
        kv, sched = self.engine.kv_cache, self.engine.scheduler
        return WorkerLoad(
            self.config.name, len(sched.waiting), len(sched.running), len(self._transferring),
            kv.num_free_blocks, kv.pool.num_blocks, kv.pool.hit_rate,
        )  # fmt: skip

    def is_idle(self) -> bool:
        return not self._held

    def pool_all_free(self) -> bool:
        return self.engine.kv_cache.num_free_blocks == self.engine.kv_cache.pool.num_blocks

    # ---- the loop ---------------------------------------------------------
    def step(self) -> bool:
        """Poll transfers, run one forward if any prompt is queued, hand over finished prompts."""
        for event in self.sender.poll(0):
            self._transfer_ended(event.request_id, 0, event.peer, event.kind, event.reason)
        for report in self.ranks.poll() if self.ranks is not None else ():
            self._transfer_ended(report.request_id, report.rank, report.peer, report.kind, report.reason)
        if self._router_lease.pop_expired():
            for request_id in list(self._held):  # the router is gone: nobody waits for these
                self._drop(request_id, f"no call from the router for {self.config.router_lease_s}s")
        if not self.engine.has_unfinished_requests():
            return False
        try:
            outputs = self.engine.step()
        except EngineStepError as err:
            for request_id in err.request_ids:
                self._give_up(request_id, str(err))
            return True
        finally:
            self._sending_now = []
            if self.ranks is not None:
                self.engine.runner.attach_to_next_step(b"")  # a step that failed before its broadcast
        for out in outputs:
            self._hand_over(out)
        return True

    def close(self) -> None:
        for request_id in list(self._held):
            self.abort(request_id)
        self.engine.shutdown()  # tensor parallel: the followers' forward loops end
        if self.ranks is not None:
            self.ranks.close()
        self.sender.close()
        self.pushers.close()

    # ---- handing a prompt to decode ---------------------------------------
    def _start_transfers(self, sched: SchedulerOutput) -> None:
        """Before a forward: open the transfer of every prompt this forward completes (its blocks are all allocated)."""
        self._sending_now, orders = [], []
        for scheduled in sched.scheduled:
            if not scheduled.samples:
                continue  # a chunk that does not reach the prompt's end
            req = scheduled.request
            res = self._tasks[req.request_id].reservation
            order = ShardOrder(req.request_id, tuple(b.block_id for b in req.blocks[res.num_cached_blocks :]), res)
            try:
                transfers = transfers_of(order, self.num_kv_heads, self.tp_size)
                start_pieces(self.sender, order, self.num_kv_heads, self.tp_size, 0)
            except (IncompatiblePeerError, ConnectionError, ValueError) as err:
                self.sender.abort(req.request_id, str(err))  # the pieces that did start
                self._start_failed[req.request_id] = f"KV transfer could not start: {err}"
                continue
            orders.append(order)
            self._sending_now.append(req.request_id)
            self._transferring[req.request_id] = transfers
        if orders and self.ranks is not None:
            self.engine.runner.attach_to_next_step(encode(ShardOrders(tuple(orders))))

    def _send_layer(self, layer: int) -> None:
        """During the forward, right after `layer`'s KV of this step is in the cache."""
        k_cache, v_cache = self.engine.runner.kv_caches[layer]
        for request_id in self._sending_now:
            self.sender.send_layer(request_id, layer, k_cache, v_cache)

    def _hand_over(self, out: RequestOutput) -> None:
        """After the forward: the first token to the router's stream at once, and to decode's inbox."""
        request_id, token = out.request_id, out.new_token_ids[0]
        failure = self._start_failed.pop(request_id, None)
        if failure is not None:
            self._give_up(request_id, failure)
            return
        task = self._tasks[request_id]
        logprobs = token_logprobs(out.outputs[0].logprobs, 1)
        self.pushers.send(task.request.stream_address, TokenDelta(request_id, 0, (token,), logprobs=logprobs))
        self.pushers.send(task.reservation.inbox_address, FirstToken(request_id, token))

    def _transfer_ended(self, request_id: str, rank: int, peer: str, kind: str, reason: str) -> None:
        """One (rank, decode address) transfer ended: free the blocks after the last, give up on a failure."""
        left = self._transferring.get(request_id)
        if left is None:
            return  # the request ended already (an abort, or another transfer's failure)
        self.transfers_ended[kind] += 1
        left.discard((rank, peer))
        if kind != "done":
            logger.warning("KV transfer of %s from rank %d to %s %s: %s", request_id, rank, peer, kind, reason)
            self._give_up(request_id, f"KV transfer from prefill rank {rank} to {peer or 'decode'} {kind}: {reason}")
        elif not left:
            self._release(request_id)

    def _abort_transfers(self, request_id: str, reason: str) -> None:
        """Abort every rank's transfers of the request; on return its blocks may be freed."""
        self.sender.abort(request_id, reason)
        if self.ranks is not None:
            self.ranks.drop(request_id, reason)

    def _give_up(self, request_id: str, reason: str) -> None:
        if request_id in self._transferring:
            self._abort_transfers(request_id, reason)
        task = self._tasks.get(request_id)
        if task is not None:
            self.pushers.send(task.reservation.inbox_address, PrefillFailed(request_id, reason))
        self._release(request_id)

    def _release(self, request_id: str) -> None:
        req = self._held.pop(request_id, None)
        if req is not None:
            release_blocks(self.engine, req)
        self._tasks.pop(request_id, None)
        self._transferring.pop(request_id, None)
        self._start_failed.pop(request_id, None)
