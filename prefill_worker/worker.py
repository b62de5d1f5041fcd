"""The prefill worker: an engine in the prefill role plus a KV sender.

It batches the prompts of many requests (chunked prefill, prefix cache: the
engine's scheduler), samples each one's first token, streams that token to
the router at once, tells the decode worker (FirstToken on its inbox), and
pushes the prompt's KV blocks into the blocks decode reserved, every layer
after the step that completed the prompt (per-step sending; the sender's
`positions` would allow chunk-by-chunk sending once blocks are reserved up front).

Ownership: from `prefill()` the request's blocks belong to the engine until
the step that samples its first token; from then on this worker holds them
(`engine.remote_kv`) and frees them on the transfer's first event (done,
failed or expired), on abort, or at once if the transfer could not start.
Not thread-safe: drive it from one thread (`engine.step_loop.StepLoop`).
Tensor parallel later: rank 0 owns this object; followers run forwards only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from engine.llm_engine import EngineArgs, EngineStepError, LLMEngine
from engine.outputs import RequestOutput
from engine.remote_kv import add_prefill_request, release_blocks
from engine.request import Request
from kvtransfer.connector import PeerTarget, TransferTimeouts
from kvtransfer.engine_bridge import kv_spec_for, sampling_params
from kvtransfer.protocol import FirstToken, IncompatiblePeerError, PrefillFailed, PrefillTask, TokenDelta, WorkerLoad
from kvtransfer.sender import KVSender
from kvtransfer.token_stream import Pushers

logger = logging.getLogger("tandem.prefill")


@dataclass(frozen=True)
class PrefillWorkerConfig:
    name: str = "prefill-0"
    timeouts: TransferTimeouts = TransferTimeouts()


class PrefillWorker:
    def __init__(self, engine_args: EngineArgs, config: PrefillWorkerConfig = PrefillWorkerConfig()):
        self.config = config
        self.engine = LLMEngine.from_args(engine_args, skip_tokenizer_init=True, show_progress=False)
        self.sender = KVSender(kv_spec_for(self.engine.config), config.name, timeouts=config.timeouts)
        self.pushers = Pushers()
        self._tasks: dict[str, PrefillTask] = {}
        self._held: dict[str, Request] = {}  # computing or transferring: blocks to release
        self._transferring: set[str] = set()

    # ---- control ----------------------------------------------------------
    def prefill(self, task: PrefillTask) -> None:
        """Queue the prompt; raises ValueError (nothing kept) if this engine cannot take it."""
        request = task.request
        params = sampling_params(request.sampling)
        req = add_prefill_request(self.engine, request.request_id, list(request.prompt_token_ids), params)
        self._tasks[request.request_id] = task
        self._held[request.request_id] = req

    def abort(self, request_id: str) -> None:
        if request_id in self._transferring:
            self.sender.abort(request_id, "aborted by the client")
        elif request_id in self._held:
            self.engine.abort_request(request_id)
        self._release(request_id)

    def load(self) -> WorkerLoad:
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
            if event.kind != "done":
                logger.warning("KV transfer of %s %s: %s", event.request_id, event.kind, event.reason)
            self._release(event.request_id)
        if not self.engine.has_unfinished_requests():
            return False
        try:
            outputs = self.engine.step()
        except EngineStepError as err:
            for request_id in err.request_ids:
                self._give_up(request_id, str(err))
            return True
        for out in outputs:
            self._hand_over(out)
        return True

    def close(self) -> None:
        for request_id in list(self._held):
            self.abort(request_id)
        self.sender.close()
        self.pushers.close()

    # ---- handing a prompt to decode ---------------------------------------
    def _hand_over(self, out: RequestOutput) -> None:
        request_id, token = out.request_id, out.new_token_ids[0]
        task, req = self._tasks[request_id], self._held[request_id]
        res = task.reservation
        self.pushers.send(task.request.stream_address, TokenDelta(request_id, 0, (token,)))
        self.pushers.send(res.inbox_address, FirstToken(request_id, token))
        src_block_ids = [b.block_id for b in req.blocks[res.num_cached_blocks :]]
        try:
            self.sender.send(request_id, src_block_ids, PeerTarget(res.kv_address, res.block_ids))
            for layer, (k_cache, v_cache) in enumerate(self.engine.runner.kv_caches):
                self.sender.send_layer(request_id, layer, k_cache, v_cache)
        except (IncompatiblePeerError, ConnectionError, ValueError) as err:
            self.sender.abort(request_id, str(err))
            self._give_up(request_id, f"KV transfer could not start: {err}")
            return
        self._transferring.add(request_id)

    def _give_up(self, request_id: str, reason: str) -> None:
        task = self._tasks.get(request_id)
        if task is not None:
            self.pushers.send(task.reservation.inbox_address, PrefillFailed(request_id, reason))
        self._release(request_id)

    def _release(self, request_id: str) -> None:
        req = self._held.pop(request_id, None)
        if req is not None:
            release_blocks(self.engine, req)
        self._tasks.pop(request_id, None)
        self._transferring.discard(request_id)
