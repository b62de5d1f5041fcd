"""The prefill worker: an engine in the prefill role plus a KV sender.

It batches the prompts of many requests (chunked prefill, prefix cache: the
engine's scheduler), samples each one's first token, streams that token to
the router at once, tells the decode worker (FirstToken on its inbox), and
pushes the prompt's KV blocks into the blocks decode reserved, layer by layer
during the forward that completes the prompt: the transfer starts before that
forward (`engine.before_forward`) and each layer goes out as soon as its
attention has written it (`engine.layer_hook`), while the next layers compute.
Earlier chunks of a chunked prompt are already in the cache and go out with it.

Ownership: from `prefill()` the request's blocks belong to the engine until
the step that samples its first token; from then on this worker holds them
(`engine.remote_kv`) and frees them on the transfer's first event (done,
failed or expired), on abort, or at once if the transfer could not start.
Not thread-safe: drive it from one thread (`engine.step_loop.StepLoop`).
Tensor parallel later: rank 0 owns this object; followers run forwards only.
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
from kvtransfer.connector import PeerTarget, TransferTimeouts
from kvtransfer.engine_bridge import kv_spec_for, sampling_params, token_logprobs
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
        self.transfers_ended: Counter[str] = Counter()  # "done" / "failed" / "expired", for metrics
        self._sending_now: list[str] = []  # transfers started for the forward under way
        self._start_failed: dict[str, str] = {}  # request id -> why its transfer could not start
        self.engine.before_forward = self._start_transfers
        install_layer_hook(self.engine.runner, self._send_layer)

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
            self.transfers_ended[event.kind] += 1
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
        finally:
            self._sending_now = []
        for out in outputs:
            self._hand_over(out)
        return True

    def close(self) -> None:
        for request_id in list(self._held):
            self.abort(request_id)
        self.sender.close()
        self.pushers.close()

    # ---- handing a prompt to decode ---------------------------------------
    def _start_transfers(self, sched: SchedulerOutput) -> None:
        """Before a forward: open the transfer of every prompt this forward completes (its blocks are all allocated)."""
        self._sending_now = []
        for scheduled in sched.scheduled:
            if not scheduled.samples:
                continue  # a chunk that does not reach the prompt's end
            req = scheduled.request
            res = self._tasks[req.request_id].reservation
            src_block_ids = [b.block_id for b in req.blocks[res.num_cached_blocks :]]
            try:
                self.sender.send(req.request_id, src_block_ids, PeerTarget(res.kv_address, res.block_ids))
            except (IncompatiblePeerError, ConnectionError, ValueError) as err:
                self._start_failed[req.request_id] = f"KV transfer could not start: {err}"
                continue
            self._sending_now.append(req.request_id)
            self._transferring.add(req.request_id)

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

    def _give_up(self, request_id: str, reason: str) -> None:
        if request_id in self._transferring:
            self.sender.abort(request_id, reason)
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
        self._start_failed.pop(request_id, None)
