"""Dispatch: one sequence of one HTTP request, from routing to its last token, on the router's event loop.

    start(prompt ids, sampling)            STARTING
      pick decode (free blocks) and prefill (the routing policy; none when no prefill worker can take it:
               `router.local_prefill`, then the request carries `local_prefill` and decode prefills it)
      an `Attempt` on them (`router.attempt`: the counts it holds on each worker, by its phase)
      handoff: `router.handoff.start_request` (reserve on decode, retry while full,
               PrefillTask to prefill; abort both on failure)
                                           -> RUNNING
    Generation.chunks()   tokens in order from the token stream, each moving the attempt's phase
      decode's first token (the second one) -> prefill's part is over (the prompt's KV landed on decode).
                             Until then a prefill worker that dies takes the request with it (its KV may
                             never come) and it resumes.
      final delta                          -> FINISHED (the attempt ends: nothing held)
    Generation.close()    always called (finally); unfinished -> abort on its workers (frees their blocks),
                                           -> CLOSED
    a call fails, a worker dies, its decode worker gives it up, the watchdog finds it silent
                                           -> RESUMING: the attempt is given up (aborted where its workers
                          live) and the request resumed on live workers (`router.migration`), up to
                          `max_resumes` times, -> RUNNING; when it cannot be, its stream fails (a clear
                          error, never a hang)

Ownership: each `Generation` is the one record of its request (state, attempts, resumes, the task moving
it); its `Attempt` owns the `in_flight` counts and `prompt_tokens_queued` charges (`router.ttft_prediction`:
from the handoff to the first token) and gives each back exactly once; a worker's blocks are the worker's,
freed by the abort it is sent. `Dispatcher.active` holds a request from `start` until it finishes or closes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import os
from dataclasses import dataclass, field
from enum import Enum
from typing import AsyncIterator, Callable, Sequence

from router.attempt import Attempt
from router.handoff import HandoffTimeouts, abort_request, start_request
from wire.requests import GenerateRequest, SamplingSpec, TokenDelta
from router.local_prefill import LocalPrefillRule, choose_prefill
from router.migration import resumed_request
from router.registry import WorkerFailed, WorkerRegistry
from router.token_stream import OutputChunk, RequestOutputs, StreamFailed, TokenStreamConsumer
from router.ttft_prediction import check_ttft
from router.worker_state import WorkerState

logger = logging.getLogger("tandem.router")

# Before resuming on a decode pool whose every worker is suspect (a call to the only decode worker just
# failed: its connection may be back in a moment), wait this long times the attempt number; the next
# answered heartbeat clears it. Without a pause, the resumes would all be spent within a millisecond.
SUSPECT_POOL_PAUSE_S = 0.5
# A request whose attempts ended in this many failed steps is taken for the cause, not its workers.
STEPS_FAILED_BEFORE_BLAME = 2


class RequestFailedSteps(StreamFailed):
    """Every worker that ran it failed a step with it: the request's fault (a 400), not theirs."""


class RequestState(Enum):
    STARTING = "starting"  # its first attempt is being handed off (`Dispatcher.start`, on the caller's task)
    RUNNING = "running"  # an attempt runs: its tokens come
    RESUMING = "resuming"  # its attempt was given up; a task moves it to other workers
    FINISHED = "finished"  # its final delta came
    CLOSED = "closed"  # ended unfinished (client gone, stream failed): its attempt aborted


# The transitions a request may make; anything else is a bug (raised, never silently applied).
REQUEST_TRANSITIONS = {
    RequestState.STARTING: {RequestState.RUNNING, RequestState.RESUMING, RequestState.CLOSED},
    RequestState.RUNNING: {RequestState.RESUMING, RequestState.FINISHED, RequestState.CLOSED},
    RequestState.RESUMING: {RequestState.RESUMING, RequestState.RUNNING, RequestState.FINISHED,
                            RequestState.CLOSED},  # fmt: skip
    RequestState.FINISHED: set(),
    RequestState.CLOSED: set(),
}


@dataclass(eq=False)
class Generation:
    """The router's record of one request, across its attempts; iterate `chunks()`, then `close()` it whatever
    happened. Its state moves only by the transitions above; its current `Attempt` owns the counts it holds
    on workers (`router.attempt`); the dispatcher owns the flow (routing, handoff, resumes, aborts)."""

    request: GenerateRequest  # as the client asked it (a resumed attempt runs `resumed_request` of it)
    outputs: RequestOutputs
    dispatcher: "Dispatcher" = field(repr=False)
    state: RequestState = RequestState.STARTING
    attempt: Attempt | None = None  # the current (or last) attempt
    resumes: int = 0  # attempts after the first
    task: asyncio.Task | None = None  # the task moving it to workers (STARTING, RESUMING); close() cancels it
    failed_steps: int = 0  # workers' steps that failed with it in them (`given_up`)

    @property
    def request_id(self) -> str:
        """The current attempt's id (the workers know the request by it)."""
        return self.attempt.request_id if self.attempt is not None else self.request.request_id

    @property
    def decode(self) -> WorkerState:
        return self.attempt.decode

    @property
    def prefill(self) -> WorkerState | None:
        """Its prefill worker while that worker's part runs (None once the KV landed, or decode prefills)."""
        return self.attempt.holding_prefill if self.attempt is not None else None

    @property
    def finished(self) -> bool:
        return self.state is RequestState.FINISHED

    @property
    def prompt_phases(self):
        """The phases its prefill worker measured (`wire.requests.PhaseTimes`; None: decode prefilled it)."""
        return self.outputs.prompt_phases

    def silent_for(self, now: float) -> float:
        """How long a running attempt has sent nothing (0: not running; the watchdog reads it)."""
        return now - self.outputs.last_activity if self.state is RequestState.RUNNING else 0.0

    async def chunks(self) -> AsyncIterator[OutputChunk]:
        async for chunk in self.outputs.chunks():
            if chunk.given_up is not None:
                self._given_up(chunk.given_up)
            self.attempt.tokens_out(self.outputs.attempt_tokens)
            if chunk.final is not None:
                self._end_attempt()
                self._to(RequestState.FINISHED)
            if chunk.token_ids or chunk.final is not None or chunk.prompt_logprobs:
                yield chunk

    def close(self) -> None:
        """Idempotent. An unfinished request (client gone, error) is aborted on its workers."""
        if self.state not in (RequestState.FINISHED, RequestState.CLOSED):
            self.leave_attempt()
            self._to(RequestState.CLOSED)

    # ---- transitions (the dispatcher's and the watchdog's events) ----------------------------------------
    def begin_attempt(self, request: GenerateRequest, decode: WorkerState, prefill: WorkerState | None) -> None:
        """`request` (this one or its continuation) goes to `decode` / `prefill`: counts taken, its deltas
        routed here, taken only from those workers."""
        self.attempt = Attempt(request.request_id, decode, prefill, len(request.prompt_token_ids))
        senders = frozenset(w.name for w in (decode, prefill) if w is not None)
        self.dispatcher.stream.open(request.request_id, self.outputs, senders)

    def running(self) -> None:
        self.task = None
        self._to(RequestState.RUNNING)

    def resuming(self, task: asyncio.Task | None = None) -> None:
        self.task = task or self.task
        self._to(RequestState.RESUMING)

    def leave_attempt(self) -> None:
        """The current attempt is given up: live workers free what they hold of it (an abort), counts go back."""
        if self.attempt is not None and not self.attempt.ended:
            self.dispatcher.abort(self.attempt)
        self._end_attempt()

    def _end_attempt(self) -> None:
        if self.attempt is not None:
            self.attempt.end()
            self.dispatcher.stream.close_request(self.attempt.request_id)

    def _given_up(self, final: TokenDelta) -> None:
        """Its decode worker ended the attempt without finishing it: a step failed with it alone in it (a
        worker's engine runs the requests of a failed batch one at a time before it gives any up, so company
        is never blamed: `LLMEngine._after_failed_step`). Once, that is taken for the worker's trouble: the
        request moves on and the worker is suspect (its heartbeats tell whether every step fails). When a
        step fails with it again, the request is the cause: it ends (`RequestFailedSteps`, a 400) instead of
        failing the steps of every worker in turn."""
        self.failed_steps += 1
        if self.failed_steps >= STEPS_FAILED_BEFORE_BLAME:
            raise RequestFailedSteps(f"{self.failed_steps} attempts of this request ended in a failed step "
                                     f"(last: {final.error}); it is not tried again")  # fmt: skip
        self.decode.suspect = True
        self.dispatcher.resume(self, f"worker {self.decode.name} gave it up: {final.error}")

    def _to(self, state: RequestState) -> None:
        if state not in REQUEST_TRANSITIONS[self.state]:
            raise RuntimeError(f"request {self.request_id}: no transition {self.state.name} -> {state.name}")
        self.state = state
        if state in (RequestState.FINISHED, RequestState.CLOSED):
            self.dispatcher.active.pop(self.request.request_id, None)
            if self.task is not None and self.task is not asyncio.current_task():
                self.task.cancel()  # a resume under way has nothing left to do; its handoff cleans up after itself


class Dispatcher:
    def __init__(self, registry: WorkerRegistry, stream: TokenStreamConsumer, colocated: bool = False,
                 timeouts: HandoffTimeouts = HandoffTimeouts(), max_resumes: int = 3,
                 local_prefill: LocalPrefillRule = LocalPrefillRule(),
                 on_local_prefill: Callable[[str], None] = lambda reason: None,
                 ttft_deadline_s: float = 0.0):  # fmt: skip
        self.registry, self.stream = registry, stream
        self.ttft_deadline_s = ttft_deadline_s  # refuse a new prompt predicted to wait longer (0: never)
        self.colocated, self.timeouts, self.max_resumes = colocated, timeouts, max_resumes
        self.local_prefill = local_prefill
        self.on_local_prefill = on_local_prefill  # told why, each time decode prefills for want of prefill
        self.active: dict[str, Generation] = {}  # by the request's first id, until it finishes or is closed
        self._ids = itertools.count()
        self._id_prefix = f"r{os.getpid():x}"
        self._background: set[asyncio.Task] = set()  # aborts in flight, kept referenced until done
        registry.on_dead(self._fail_requests_of)

    async def start(self, prompt_ids: Sequence[int], sampling: SamplingSpec) -> Generation:
        """Route and hand off; raises `FirstTokenTooLate`, `NoLiveWorker`, `HandoffError`, `StreamFailed` or
        ValueError (nothing held).

        A worker that fails under the handoff is suspect and the request goes to other workers; `StreamFailed`
        when that cannot be done. The TTFT check and the prompt's charge happen with no await between them,
        so requests arriving together each see the ones before them."""
        check_ttft(self.prompt_workers(), len(prompt_ids), self.ttft_deadline_s)
        decode, prefill = self._route(prompt_ids, sampling.cache_salt)
        request_id = f"{self._id_prefix}-{next(self._ids)}"
        request = GenerateRequest(request_id, tuple(prompt_ids), sampling, self.stream.address)
        gen = Generation(request, RequestOutputs(), self, task=asyncio.current_task())
        self.active[request_id] = gen
        try:
            failed = await self._attempt(gen, request, decode, prefill)
            if failed is not None:
                await self._resume(gen, failed, raise_failure=True)
            else:
                gen.running()
        except BaseException:
            gen.close()
            raise
        finally:
            gen.task = None
        return gen

    def _route(self, tokens: Sequence[int], cache_salt: str | None = None) -> tuple[WorkerState, WorkerState | None]:
        """The decode worker and the prefill worker (None: decode prefills) for a prompt (and its prefix-cache
        salt, which the routing policy keys its blocks by); raises `NoLiveWorker`."""
        decode = self.registry.pick_decode(tokens, cache_salt)
        if self.colocated:
            return decode, None
        prefill, why = choose_prefill(self.registry, self.local_prefill, tokens, decode, cache_salt)
        if prefill is None:
            logger.debug("decode worker %s prefills a prompt itself: %s", decode.name, why)
            self.on_local_prefill(why)
        return decode, prefill

    async def _attempt(self, gen: Generation, request: GenerateRequest, decode: WorkerState,
                       prefill: WorkerState | None) -> WorkerState | None:  # fmt: skip
        """Hand `request` (an attempt of `gen`) to its workers; the worker that failed it (a call failed, or
        it was marked dead meanwhile), or None when it started. Raises what is the request's own failure;
        on any failure the attempt holds nothing."""
        gen.begin_attempt(request, decode, prefill)
        workers = [w for w in (decode, prefill) if w is not None]
        try:
            # No prefill worker given: decode prefills the prompt whatever its local_prefill_threshold.
            reservation = await start_request(dataclasses.replace(request, local_prefill=prefill is None),
                                              decode.endpoint, prefill.endpoint if prefill else None,
                                              self.timeouts)  # fmt: skip
        except WorkerFailed as failure:
            gen.leave_attempt()
            return next((w for w in workers if w.name == failure.worker), workers[0])
        except BaseException:
            gen.leave_attempt()  # a cancelled handoff may have left a reservation behind: abort it
            raise
        if reservation.prefill_locally:
            gen.attempt.prefill_locally()
        return next((w for w in gen.attempt.workers if not w.alive), None)

    def prompt_workers(self) -> list[WorkerState]:
        """The workers a new prompt may be computed on: the prefill pool, or decode when none (colocated)."""
        prefill = [] if self.colocated else self.registry.pickable("prefill")
        return prefill or self.registry.pickable("decode")

    def abort(self, attempt: Attempt) -> None:
        """Fire and forget an abort to the live workers still holding part of `attempt` (the caller may be a
        cancelled task, which cannot await any more); one whose control connection is down gets it once it
        is back (`router.control_client.ControlEndpoint`)."""
        # Decode first; when decode died, the prefill worker alone (it may still hold the prompt's blocks).
        live = [w.endpoint for w in (attempt.decode, attempt.holding_prefill) if w is not None and w.alive]
        if not live:
            return
        task = asyncio.get_running_loop().create_task(abort_request(attempt.request_id, *live))
        self._background.add(task)
        task.add_done_callback(self._abort_done)

    def _abort_done(self, task: asyncio.Task) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.warning("a request could not be aborted now: %s", task.exception())

    def _fail_requests_of(self, worker: WorkerState) -> None:
        """A worker died: resume every running request it held (decode: always; prefill: until its KV landed
        on decode). One starting or resuming finds out when its handoff ends (`_attempt`)."""
        for gen in list(self.active.values()):
            if gen.state is RequestState.RUNNING and any(w is worker for w in gen.attempt.workers):
                gen.resuming(asyncio.get_running_loop().create_task(self._resume(gen, worker)))

    def resume(self, gen: Generation, why: str, failure: type[StreamFailed] = StreamFailed) -> None:
        """Move a running `gen` to other workers now (its workers are fine as far as anyone can tell: the
        watchdog); when its resumes are spent it ends with `failure(why ...)`."""
        if gen.state is RequestState.RUNNING:
            gen.resuming(asyncio.get_running_loop().create_task(self._resume(gen, gen.decode, why=why,
                                                                             failure=failure)))  # fmt: skip

    async def _resume(self, gen: Generation, failed: WorkerState, raise_failure: bool = False, why: str = "",
                      failure: type[StreamFailed] = StreamFailed) -> None:  # fmt: skip
        """Move `gen` to other workers after `failed` failed it (died, or a call to it failed); when that cannot
        be done, end its stream with the error (or raise it: `raise_failure`, the request is still starting)."""
        try:
            while True:
                reason = why or f"worker {failed.name} failed"
                gen.leave_attempt()
                if gen.resumes >= self.max_resumes:
                    raise failure(f"{reason}; the request was resumed {gen.resumes} times already")
                gen.resuming()
                gen.resumes += 1
                if self.registry.pickable("decode") and not self.registry.trusted("decode"):
                    await asyncio.sleep(SUSPECT_POOL_PAUSE_S * gen.resumes)  # closed meanwhile: cancelled here
                request = resumed_request(gen.request, gen.outputs.delivered, gen.resumes,
                                          suspect=gen.failed_steps > 0)  # fmt: skip
                gen.outputs.restart()
                if request is None:  # every allowed token was handed out: only the final delta was lost
                    n, prompt = len(gen.outputs.delivered), len(gen.request.prompt_token_ids)
                    gen.outputs.put(TokenDelta(gen.request_id, 0, (), True, "length", prompt + n, 0))
                    return
                try:
                    decode, prefill = self._route(request.prompt_token_ids, request.sampling.cache_salt)
                except Exception as err:
                    raise StreamFailed(f"{reason} and the request cannot be resumed: {err}") from err
                logger.warning("resuming %s on %s after %s", request.request_id, decode.name, reason)
                try:
                    now_failed = await self._attempt(gen, request, decode, prefill)
                except Exception as err:  # the request's own failure there (decode full...): try again
                    logger.warning("resuming %s failed: %s", request.request_id, err)
                    continue
                if now_failed is None:
                    return gen.running()
                failed, why = now_failed, ""
        except StreamFailed as failure:
            if raise_failure:
                raise
            gen.outputs.put(failure)
        finally:
            if gen.task is asyncio.current_task():
                gen.task = None

    async def drain_aborts(self) -> None:
        """Wait for the aborts already sent (shutdown, tests)."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)
