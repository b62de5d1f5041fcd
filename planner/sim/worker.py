"""One simulated worker: a real engine in its role, on a loop that follows `runtime.loop` round for round.

    round:  handle every message that arrived (reserve, prefill task, first token, KV landed, transfer done)
            admit what is ready (decode: KV landed and first token in, when a seat is free)
            publish the load the router's next poll reads
            one engine step when there is work and the arrival window lets it (priced: the worker is busy
            until the step's end; messages arriving meanwhile wait, as in a real loop)
    step's end: its outputs go out (prefill: first token to the router and decode, the KV transfer starts;
            decode: a token delta per request), then the next round at once

Roles as `tandem serve` builds them (`cluster.workers`): a prefill worker; a decode worker that prefills
prompts itself when asked (`local_prefill`) or below `local_prefill_threshold` uncached tokens (every
prompt, colocated). Blocks are owned as in the real roles (`engine.remote_kv`): a prefill worker holds a
finished prompt's blocks until the transfer is done; a decode worker's reservation is the engine's.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Callable

from costmodel import Neighbours, Profile
from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from engine.llm_engine import LLMEngine
from engine.remote_kv import NoFreeBlocks, add_prefill_request, admit_remote_kv, count_uncached_tokens, release_blocks
from engine.remote_kv import reserve_remote_kv
from engine.sampling_params import SamplingParams
from planner.layout import EngineLimits
from planner.sim.events import EventQueue
from planner.sim.messages import FirstToken, KVLanded, Prefill, Refused, Reserve, Reserved, TransferDone
from planner.sim.priced_runner import PricedRunner, SimClock
from runtime.arrival_window import ArrivalWindow, ArrivalWindowConfig
from wire.requests import WorkerLoad

COLOCATED_THRESHOLD = 1 << 62  # cluster.workers' value: more uncached tokens than any prompt has


@dataclass
class _AwaitingKV:
    """A reserved request on decode: it joins the batch once both have come."""

    first_token: int | None = None
    kv_landed: bool = False


class SimWorker:
    def __init__(self, name: str, role: str, profile: Profile, limits: EngineLimits, events: EventQueue,
                 window: ArrivalWindowConfig = ArrivalWindowConfig(), local_prefill_threshold: int = 0):  # fmt: skip
        self.name, self.role, self.profile, self.events = name, role, profile, events
        self.serving = profile.serving
        self.clock = SimClock()
        self.engine = sim_engine(profile, limits, self.clock, self._neighbours, sends_kv=role == "prefill")
        self.host: list[SimWorker] = [self]  # the workers on this one's host (`planner.sim.run` sets it)
        self.window = ArrivalWindow(window)
        self.local_prefill_threshold = local_prefill_threshold
        self.router = None  # the SimRouter, set when it registers this worker
        self.mailbox: deque = deque()
        self.in_step = False
        self._wake_at: float | None = None
        self._awaiting: dict[str, _AwaitingKV] = {}  # decode: reserved, KV or first token still to come
        self._held: dict[str, tuple] = {}  # prefill: request id -> (engine Request holding blocks, its Prefill task)
        self._link_free_at = 0.0  # prefill: when its KV sender has sent what it was given
        self.load = self._snapshot()

    def _neighbours(self) -> Neighbours | None:
        """What this host's other workers do now: the share inside a step or with work queued, and the share of
        those that decode (every role but prefill); None when it has no other. (A step's requests are already
        advanced when it starts: inside its last step a worker has none.)"""
        others = [w for w in self.host if w is not self]
        if not others:
            return None
        busy = [w for w in others if w.in_step or w.engine.has_unfinished_requests()]
        return Neighbours(len(busy) / len(others), sum(1 for w in busy if w.role != "prefill") / len(others))

    # ---- delivery ----------------------------------------------------------------
    def post(self, message) -> None:
        """`message` arrives now; a worker inside a step reads it at the step's end."""
        self.mailbox.append(message)
        self._wake(self.events.now)

    def _wake(self, when: float) -> None:
        if self.in_step or (self._wake_at is not None and self._wake_at <= when):
            return
        self._wake_at = when
        self.events.at(when, self._round, when)

    # ---- the loop -----------------------------------------------------------------
    def _round(self, scheduled_for: float) -> None:
        if self._wake_at != scheduled_for or self.in_step:
            return  # superseded by an earlier wake-up, or a step started meanwhile
        self._wake_at = None
        now = self.clock.now = self.events.now
        while self.mailbox:
            self._handle(self.mailbox.popleft(), now)
        self._admit_ready()
        self.load = self._snapshot()
        if not self.engine.has_unfinished_requests():
            return
        hold = self.window.hold_until(now)
        if hold is not None:
            return self._wake(hold)
        steps = self.engine.runner.steps
        outputs = self.engine.step()
        if self.engine.runner.steps == steps:
            return  # nothing could be scheduled (no free block): wait for a message to change that
        self.in_step = True
        self.events.at(self.clock.now + self.serving.per_round_s, self._step_done, now, outputs)

    def _step_done(self, started: float, outputs) -> None:
        self.in_step = False
        now = self.events.now
        if self.role == "prefill":
            for out in outputs:
                self._prompt_done(out, started, now)
        elif outputs:  # one message per step, its deltas in order, as the worker pushes them together
            deltas = [(out.request_id, len(out.new_token_ids), out.finished) for out in outputs]
            self.events.at(now + self.serving.message_s, self.router.deltas, deltas)
        self._wake(now)

    # ---- messages ---------------------------------------------------------------------
    def _handle(self, message, now: float) -> None:
        if isinstance(message, Reserve):
            self._reserve(message, now)
        elif isinstance(message, Prefill):
            request = add_prefill_request(self.engine, message.request_id, list(message.prompt),
                                          _params(message.output_len))  # fmt: skip
            self._held[message.request_id] = (request, message)
            self.window.arrived(now, engine_busy=bool(self.engine.scheduler.running))
        elif isinstance(message, FirstToken):
            self._awaiting[message.request_id].first_token = message.token_id
        elif isinstance(message, KVLanded):
            self._awaiting[message.request_id].kv_landed = True
        elif isinstance(message, TransferDone):
            release_blocks(self.engine, self._held.pop(message.request_id)[0])

    def _reserve(self, message: Reserve, now: float) -> None:
        rid, prompt, params = message.request_id, list(message.prompt), _params(message.output_len)
        try:
            if message.local_prefill or count_uncached_tokens(self.engine, prompt) < self.local_prefill_threshold:
                self.engine.add_request(rid, prompt, params)
                self.window.arrived(now, engine_busy=bool(self.engine.scheduler.running))
                return self._reply(rid, Reserved(prefill_locally=True), now)
            reservation = reserve_remote_kv(self.engine, rid, prompt, params)
        except NoFreeBlocks as err:
            return self._reply(rid, Refused(str(err), retryable=True), now)
        except ValueError as err:
            return self._reply(rid, Refused(str(err), retryable=False), now)
        self._awaiting[rid] = _AwaitingKV()
        self._reply(rid, Reserved(False, reservation.num_uncached_tokens), now)

    def _admit_ready(self) -> None:
        for rid, waiting in list(self._awaiting.items()):
            if waiting.first_token is None or not waiting.kv_landed:
                continue
            out = admit_remote_kv(self.engine, rid, waiting.first_token)
            if out is None:
                return  # no seat: admitted in order once one frees
            del self._awaiting[rid]
            if out.finished:  # its one token was the prefill worker's: only the end is news
                self._send_delta(rid, 0, True, self.clock.now)

    # ---- outputs ------------------------------------------------------------------------
    def _prompt_done(self, out, started: float, now: float) -> None:
        """A prompt's first token: to the router and to decode at once; its KV, streamed layer by layer while
        the step ran, lands once the sender's link has carried it."""
        task = self._held[out.request_id][1]
        hop = self.serving.message_s
        self._send_delta(out.request_id, 1, False, now)
        self.events.at(now + hop, task.decode.post, FirstToken(out.request_id, out.new_token_ids[0]))
        landed = self._transfer_lands(task.uncached_tokens, started, now)
        self.events.at(landed, task.decode.post, KVLanded(out.request_id))
        self.events.at(landed + hop, self.post, TransferDone(out.request_id))

    def _transfer_lands(self, tokens: int, started: float, ended: float) -> float:
        """When `tokens` tokens of KV, computed by the step [started, ended], are in on decode: the sender streams
        each layer as the forward writes it, one transfer after another on its link; the last layer goes
        after the step."""
        cost = self.profile.transfer
        wire_s = self.profile.transfer_seconds(tokens) - cost.latency_s
        start = max(started, self._link_free_at)
        landed = max(start + wire_s, ended + wire_s / self.profile.model.num_layers) + cost.latency_s
        self._link_free_at = landed - cost.latency_s
        return landed

    def _send_delta(self, request_id: str, tokens: int, finished: bool, now: float) -> None:
        self.events.at(now + self.serving.message_s, self.router.delta, request_id, tokens, finished)

    def _reply(self, request_id: str, reply, now: float) -> None:
        self.events.at(now + self.serving.message_s, self.router.reserved, request_id, reply)

    def _snapshot(self) -> WorkerLoad:
        kv, sched, meter = self.engine.kv_cache, self.engine.scheduler, self.engine.prefill_meter
        return WorkerLoad(self.name, len(sched.waiting) + len(sched.waiting_for_kv), len(sched.running),
                          len(self._held), kv.num_free_blocks, kv.pool.num_blocks, kv.pool.hit_rate,
                          prompt_tokens_advanced=meter.tokens, prompt_seconds=meter.seconds)  # fmt: skip


def _params(output_len: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)


def sim_engine(profile: Profile, limits: EngineLimits, clock: SimClock,
               neighbours: Callable[[], Neighbours | None] = lambda: None, sends_kv: bool = False) -> LLMEngine:  # fmt: skip
    """A real `LLMEngine` (scheduler, block pool, prefix cache) whose steps are priced by `profile` (`sends_kv`:
    a prefill worker's, which stream their prompts' KV out)."""
    dims = profile.model
    model = ModelConfig(architecture="LlamaForCausalLM", vocab_size=dims.vocab_size, hidden_size=dims.hidden_size,
                        intermediate_size=dims.intermediate_size, num_layers=dims.num_layers,
                        num_heads=dims.num_heads, num_kv_heads=dims.num_kv_heads, head_dim=dims.head_dim,
                        rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=dims.max_position_embeddings,
                        tie_word_embeddings=dims.tie_word_embeddings, qkv_bias=False, qk_norm=False)  # fmt: skip
    num_blocks = limits.num_blocks(profile)
    config = EngineConfig(
        model_dir=f"(simulated {dims.name})", model=model,
        cache=CacheConfig(limits.block_size, num_kv_blocks=num_blocks, enable_prefix_caching=limits.enable_prefix_caching),
        scheduler=SchedulerConfig(limits.max_num_seqs, limits.max_num_batched_tokens,
                                  limits.max_model_len or dims.max_position_embeddings),
    )  # fmt: skip
    runner = PricedRunner(profile, num_blocks, clock, dims.vocab_size - 1, neighbours, sends_kv)
    quiet = logging.getLogger("tandem.engine")
    level, quiet.level = quiet.level, logging.WARNING  # "engine ready" once per simulated worker is noise
    try:
        return LLMEngine(config, skip_tokenizer_init=True, show_progress=False, runner=runner, clock=clock)
    finally:
        quiet.setLevel(level)
