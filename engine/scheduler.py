"""Continuous batching with no prefill phase and no decode phase.

Each step hands out a token budget (`max_num_batched_tokens`): running
requests first (a decode needs one token, an unfinished prompt its next
chunk), then waiting requests, whose prompts are chunked into what is left.
When blocks run out, the newest running request is preempted: its blocks are
freed and it is recomputed later from its prompt plus the tokens it already
produced. The scheduler knows no tensors; the model runner knows no queues.

Disaggregated decode adds a third queue, `waiting_for_kv` (vLLM v1's
WAITING_FOR_REMOTE_KVS): requests whose blocks are reserved and whose prompt
KV is arriving from a prefill worker. They are never scheduled; once their KV
has landed `admit_remote` moves them into the running batch, prompt computed,
when a seat is free.
"""

from __future__ import annotations

from collections import deque
from itertools import chain
from dataclasses import dataclass, field

from engine.config import SchedulerConfig
from engine.kv_cache_manager import KVCacheManager
from engine.request import Request, RequestStatus


@dataclass(frozen=True)
class ScheduledRequest:
    """One request's share of a step, fixed at scheduling time."""

    request: Request
    num_new_tokens: int  # tokens computed this step, starting at request.num_computed_tokens
    samples: bool  # this step reaches the request's last token, so its logits are sampled

    @classmethod
    def of(cls, request: Request, num_new_tokens: int) -> "ScheduledRequest":
        reaches_end = request.num_computed_tokens + num_new_tokens == request.num_tokens
        return cls(request, num_new_tokens, reaches_end)

    @property
    def is_decode(self) -> bool:
        # Any single-query sequence can take the batched decode attention path.
        return self.num_new_tokens == 1


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)  # decodes first, then prefills
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv_cache: KVCacheManager):
        self.config = config
        self.kv_cache = kv_cache
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.waiting_for_kv: dict[str, Request] = {}  # request id -> request whose prompt KV is arriving
        self.num_preemptions = 0  # total since start, for metrics and tests

    def add_request(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        """Work for the next step (requests waiting for remote KV are not: nothing to compute yet)."""
        return bool(self.waiting or self.running)

    def wait_for_kv(self, request: Request) -> None:
        """`request` holds blocks for its whole prompt; its KV will be written there from elsewhere."""
        request.status = RequestStatus.WAITING_FOR_KV
        self.waiting_for_kv[request.request_id] = request

    def admit_remote(self, request: Request) -> bool:
        """Its KV has landed: join the running batch with the prompt computed; False (nothing done) if no seat."""
        if len(self.running) >= self.config.max_num_seqs:
            return False
        del self.waiting_for_kv[request.request_id]
        request.num_computed_tokens = request.num_prompt_tokens
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        return True

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        suspect = next((r for r in chain(self.running, self.waiting) if r.suspect), None)  # no copy of either
        if suspect is not None:  # alone: the step's failure, if any, is its own
            self._schedule_alone(out, suspect, budget)
            if not out.scheduled:  # no blocks for it now: the running others step (and free some), it waits
                self._schedule_beside(out, budget)
            return out
        budget = self._schedule_running(out, budget)
        if not out.preempted:
            self._schedule_waiting(out, budget)
        # Decodes first, shortest context first, so attention can group similar lengths.
        out.scheduled.sort(key=lambda s: (not s.is_decode, s.request.num_computed_tokens if s.is_decode else 0))
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            while not self.kv_cache.allocate_slots(request, num_new):
                victim = self.running.pop()
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is request:
                    return budget
            out.scheduled.append(ScheduledRequest.of(request, num_new))
            budget -= num_new
            i += 1
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            num_new = self._start(self.waiting[0], out, budget)
            if num_new is None:
                break
            budget -= num_new

    def _start(self, request: Request, out: SchedulerOutput, budget: int) -> int | None:
        """Move waiting `request` to running with its first chunk after its cached prefix scheduled; the chunk's
        tokens, or None (nothing done) when its blocks cannot be had now."""
        cached = self.kv_cache.find_cached_prefix(request)
        num_cached_tokens = len(cached) * self.kv_cache.block_size
        num_new = min(request.num_tokens - num_cached_tokens, budget)
        if not self.kv_cache.allocate_slots(request, num_new, cached):
            return None
        self.waiting.remove(request)
        if request.status == RequestStatus.WAITING:
            request.num_cached_tokens = num_cached_tokens
            self.kv_cache.pool.record_query(request.num_prompt_tokens, num_cached_tokens)
        request.num_computed_tokens = num_cached_tokens
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        out.scheduled.append(ScheduledRequest.of(request, num_new))
        return num_new

    def _schedule_alone(self, out: SchedulerOutput, request: Request, budget: int) -> None:
        """`request` in a step of its own (others wait a step); nothing when its blocks cannot be found now."""
        if request in self.running:
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            if self.kv_cache.allocate_slots(request, num_new):
                out.scheduled.append(ScheduledRequest.of(request, num_new))
            return
        # Waiting: set aside to recompute (it had a seat when its step failed, so no seat bound here), or new and
        # suspect from an earlier attempt (`wire.requests.GenerateRequest.suspect`): that one waits for a seat.
        if request.status == RequestStatus.WAITING and len(self.running) >= self.config.max_num_seqs:
            return
        self._start(request, out, budget)

    def _schedule_beside(self, out: SchedulerOutput, budget: int) -> None:
        """The running requests that are not suspects (never batched with one), as usual."""
        suspects = [r for r in self.running if r.suspect]
        self.running = [r for r in self.running if not r.suspect]
        try:
            self._schedule_running(out, budget)
        finally:
            self.running += suspects

    def set_aside(self, request: Request) -> None:
        """A running request whose step failed beside others: its blocks go back (their KV cannot be trusted)
        and it recomputes, alone (`suspect`), from its tokens so far."""
        self.running.remove(request)
        request.suspect = True
        self._preempt(request)

    def _preempt(self, request: Request) -> None:
        self.kv_cache.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def finish(self, request: Request, status: RequestStatus) -> None:
        """End a request (stop, length or abort) and return its blocks at once, unless it holds them for a transfer."""
        request.status = status
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        else:
            self.waiting_for_kv.pop(request.request_id, None)
        if not request.hold_blocks:
            self.kv_cache.free(request)
