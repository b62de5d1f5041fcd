"""Dispatch: one sequence of one HTTP request, from routing to its last token, on the router's event loop.

    start(prompt ids, sampling)
      pick decode (free blocks) and prefill (the routing policy; none when no prefill worker can take it:
               `router.local_prefill`, then the request carries `local_prefill` and decode prefills it);
               in_flight += 1 on each
      handoff: `router.handoff.start_request` (reserve on decode, retry while full,
               PrefillTask to prefill; abort both on failure)
    Generation.chunks()   tokens in order from the token stream
      decode's first token (the second one) or the final delta -> prefill's part is over (the prompt's
                             KV landed on decode): its in_flight -= 1. Until then a prefill worker that
                             dies takes the request with it (its KV may never come) and it resumes.
      final delta         -> decode's part is over: its in_flight -= 1
    Generation.close()    always called (finally); unfinished -> abort on both workers (frees their blocks)
    a call fails          (the worker is only suspect) that attempt is given up and the request resumed
                          on other workers (`router.migration`), as below
    a worker dies         every request it held (decode: any time; prefill: until its KV landed) is
                          resumed on live workers, up to `max_resumes` times; with no live decode worker
                          left its stream fails (a clear error, never a hang)

Ownership: the dispatcher owns the `in_flight` counts and the `prompt_tokens_queued` charges
(`router.ttft_prediction`: from the handoff to the first token) it adds, and gives each back
exactly once; a worker's blocks are the worker's, freed by the abort it is sent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import os
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable, Sequence

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
# A request whose own steps failed on this many workers is taken for the cause, not them.
STEPS_FAILED_BEFORE_BLAME = 2


class RequestFailedSteps(StreamFailed):
    """Every worker that ran it failed a step with it: the request's fault (a 400), not theirs."""


@dataclass
class Generation:
    """One dispatched sequence; iterate `chunks()`, then `close()` it whatever happened."""

    request: GenerateRequest  # as the client asked it (a resumed attempt runs `resumed_request` of it)
    decode: WorkerState
    prefill: WorkerState | None  # None once its part is over (or when decode prefilled locally)
    outputs: RequestOutputs
    dispatcher: "Dispatcher" = field(repr=False)
    finished: bool = False
    closed: bool = False
    request_id: str = ""  # the current attempt's id (the workers know the request by it)
    attempt: int = 0  # 0: the first; n: resumed n times
    resuming: asyncio.Task | None = None
    prompt_charge: tuple[WorkerState, int] | None = None  # (worker computing its prompt, tokens) until first token
    failed_steps: int = 0  # workers' steps that failed with it in them (`Dispatcher._given_up`)

    def __post_init__(self):
        self.request_id = self.request_id or self.request.request_id

    async def chunks(self) -> AsyncIterator[OutputChunk]:
        async for chunk in self.outputs.chunks():
            if chunk.token_ids:
                self.dispatcher._settle_prompt(self)
            if self.outputs.attempt_tokens > 1:  # decode made a token: the prompt's KV landed there
                self.dispatcher._end_prefill_part(self)
            if chunk.final is not None:
                self.finished = True
                self.dispatcher._end_decode_part(self)
            yield chunk

    def close(self) -> None:
        """Idempotent. An unfinished generation (client gone, error) is aborted on both workers."""
        self.dispatcher._close(self)

    @property
    def prompt_phases(self):
        """The phases its prefill worker measured (`wire.requests.PhaseTimes`; None: decode prefilled it)."""
        return self.outputs.prompt_phases


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
        self.active: dict[str, Generation] = {}
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
        decode, prefill = self._route(prompt_ids)
        request_id = f"{self._id_prefix}-{next(self._ids)}"
        request = GenerateRequest(request_id, tuple(prompt_ids), sampling, self.stream.address)
        gen = Generation(request, decode, prefill, self.stream.open(request_id), self)
        gen.outputs.on_given_up = lambda final: self._given_up(gen, final)
        self.active[request_id] = gen
        gen.resuming = asyncio.current_task()  # a worker dying under this handoff is dealt with here
        try:
            failed = await self._attempt(gen, request)
            if failed is not None:
                await self._resume(gen, failed, raise_failure=True)
        finally:
            gen.resuming = None
        return gen

    def _route(self, tokens: Sequence[int]) -> tuple[WorkerState, WorkerState | None]:
        """The decode worker and the prefill worker (None: decode prefills) for a prompt; raises `NoLiveWorker`."""
        decode = self.registry.pick_decode(tokens)
        if self.colocated:
            return decode, None
        prefill, why = choose_prefill(self.registry, self.local_prefill, tokens, decode)
        if prefill is None:
            logger.debug("decode worker %s prefills a prompt itself: %s", decode.name, why)
            self.on_local_prefill(why)
        return decode, prefill

    async def _attempt(self, gen: Generation, request: GenerateRequest) -> WorkerState | None:
        """Hand `request` (an attempt of `gen`) to its workers; the worker that failed it (a call failed, or
        it was marked dead meanwhile), or None when it started. Raises what is the request's own failure."""
        workers = [w for w in (gen.decode, gen.prefill) if w is not None]
        try:
            # No prefill worker given: decode prefills the prompt whatever its local_prefill_threshold.
            await self._hand_off(gen, dataclasses.replace(request, local_prefill=gen.prefill is None))
        except WorkerFailed as failure:
            return next((w for w in workers if w.name == failure.worker), workers[0])
        return next((w for w in (gen.decode, gen.prefill) if w is not None and not w.alive), None)

    async def _hand_off(self, gen: Generation, request: GenerateRequest) -> None:
        """Start `request` (an attempt of `gen`) on `gen.decode` / `gen.prefill`; on failure nothing is held."""
        gen.decode.in_flight += 1
        if gen.prefill is not None:
            gen.prefill.in_flight += 1
        gen.outputs.senders = frozenset(w.name for w in (gen.decode, gen.prefill) if w is not None)
        self._charge_prompt(gen, gen.prefill or gen.decode, len(request.prompt_token_ids))
        try:
            reservation = await start_request(
                request, gen.decode.endpoint, gen.prefill.endpoint if gen.prefill else None, self.timeouts
            )
        except BaseException:
            gen.close()  # a cancelled handoff may have left a reservation behind: abort it
            raise
        if reservation.prefill_locally:
            self._end_prefill_part(gen)
            self._charge_prompt(gen, gen.decode, len(request.prompt_token_ids))

    def prompt_workers(self) -> list[WorkerState]:
        """The workers a new prompt may be computed on: the prefill pool, or decode when none (colocated)."""
        prefill = [] if self.colocated else self.registry.pickable("prefill")
        return prefill or self.registry.pickable("decode")

    def _charge_prompt(self, gen: Generation, worker: WorkerState, tokens: int) -> None:
        self._settle_prompt(gen)
        worker.prompt_tokens_queued += tokens
        gen.prompt_charge = (worker, tokens)

    @staticmethod
    def _settle_prompt(gen: Generation) -> None:
        """Its prompt is computed (its first token came) or given up: the charge goes back, once."""
        if gen.prompt_charge is not None:
            worker, tokens = gen.prompt_charge
            worker.prompt_tokens_queued -= tokens
            gen.prompt_charge = None

    def _end_prefill_part(self, gen: Generation) -> None:
        if gen.prefill is not None:
            gen.prefill.in_flight -= 1
            gen.prefill = None

    def _end_decode_part(self, gen: Generation) -> None:
        self._end_prefill_part(gen)  # a final delta means prefill's part is long over
        self._settle_prompt(gen)
        if not gen.closed:
            gen.decode.in_flight -= 1
            gen.closed = True
            self.active.pop(gen.request_id, None)
            self.stream.close_request(gen.request_id)

    def _close(self, gen: Generation) -> None:
        if gen.resuming is not None and gen.resuming is not asyncio.current_task():
            gen.resuming.cancel()  # its handoff cleans up after itself
        if gen.closed:
            return
        prefill = gen.prefill
        if not gen.finished:
            self._abort(gen.request_id, gen.decode, prefill)
        self._end_decode_part(gen)

    def _abort(self, request_id: str, decode: WorkerState, prefill: WorkerState | None) -> None:
        """Fire and forget: the caller may be a cancelled task, which cannot await any more."""
        decode_ep = decode.endpoint if decode.alive else None
        prefill_ep = prefill.endpoint if prefill is not None and prefill.alive else None
        if decode_ep is None and prefill_ep is None:
            return
        if decode_ep is None:  # decode died: the prefill worker may still hold the prompt's blocks
            decode_ep, prefill_ep = prefill_ep, None
        task = asyncio.get_running_loop().create_task(abort_request(request_id, decode_ep, prefill_ep))
        self._background.add(task)
        task.add_done_callback(self._abort_done)

    def _abort_done(self, task: asyncio.Task) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.warning("a request could not be aborted: %s", task.exception())

    def _fail_requests_of(self, worker: WorkerState) -> None:
        """A worker died: resume every request it held (decode: always; prefill: until its KV landed on decode)."""
        for gen in list(self.active.values()):
            if (gen.decode is worker or gen.prefill is worker) and gen.resuming is None:
                gen.resuming = asyncio.get_running_loop().create_task(self._resume(gen, worker))

    def _given_up(self, gen: Generation, final: TokenDelta) -> None:
        """Its decode worker ended the request without finishing it (a failed step). Once, that is taken for
        the worker's trouble: the request moves on and the worker is suspect (its heartbeats tell whether
        every step fails). When a second worker's step fails with it too, the request is the likely cause:
        it ends (`RequestFailedSteps`, a 400) instead of failing the steps of every worker in turn."""
        gen.failed_steps += 1
        if gen.failed_steps >= STEPS_FAILED_BEFORE_BLAME:
            self._leave_workers(gen)
            gen.outputs.put(RequestFailedSteps(f"the steps of {gen.failed_steps} workers failed with this request "
                                               f"in them (last: {final.error}); it is not tried again"))  # fmt: skip
            return
        gen.decode.suspect = True
        self.resume(gen, f"worker {gen.decode.name} gave it up: {final.error}")

    def resume(self, gen: Generation, why: str, failure: type[StreamFailed] = StreamFailed) -> None:
        """Move `gen` to other workers now (its workers are fine as far as anyone can tell: the watchdog);
        when its resumes are spent it ends with `failure(why ...)`."""
        if gen.resuming is None and not gen.closed:
            gen.resuming = asyncio.get_running_loop().create_task(self._resume(gen, gen.decode, why=why,
                                                                               failure=failure))  # fmt: skip

    async def _resume(self, gen: Generation, failed: WorkerState, raise_failure: bool = False, why: str = "",
                      failure: type[StreamFailed] = StreamFailed) -> None:  # fmt: skip
        """Move `gen` to other workers after `failed` failed it (died, or a call to it failed); when that cannot
        be done, end its stream with the error (or raise it: `raise_failure`, the request is still starting)."""
        try:
            while True:
                reason = why or f"worker {failed.name} failed"
                if gen.attempt >= self.max_resumes:
                    raise failure(f"{reason}; the request was resumed {gen.attempt} times already")
                self._leave_workers(gen)
                gen.attempt += 1
                if self.registry.pickable("decode") and not self.registry.trusted("decode"):
                    await asyncio.sleep(SUSPECT_POOL_PAUSE_S * gen.attempt)  # closed meanwhile: cancelled here
                request = resumed_request(gen.request, gen.outputs.delivered, gen.attempt)
                gen.outputs.restart()
                if request is None:  # every allowed token was handed out: only the final delta was lost
                    gen.outputs.put(self._length_final(gen))
                    return
                try:
                    gen.decode, gen.prefill = self._route(request.prompt_token_ids)
                except Exception as err:
                    raise StreamFailed(f"{reason} and the request cannot be resumed: {err}") from err
                gen.request_id, gen.closed = request.request_id, False
                self.active[request.request_id] = gen
                self.stream.open(request.request_id, gen.outputs)
                logger.warning("resuming %s on %s after %s", request.request_id, gen.decode.name, reason)
                try:
                    now_failed = await self._attempt(gen, request)
                except Exception as err:  # the request's own failure there (decode full...): try again
                    logger.warning("resuming %s failed: %s", request.request_id, err)
                    continue
                if now_failed is None:
                    return
                failed, why = now_failed, ""
        except StreamFailed as failure:
            if raise_failure:
                self._leave_workers(gen)
                raise
            gen.outputs.put(failure)
        finally:
            gen.resuming = None

    def _leave_workers(self, gen: Generation) -> None:
        """The current attempt is given up: live workers free what they hold of it; counts given back."""
        if not gen.closed:
            self._abort(gen.request_id, gen.decode, gen.prefill)
        self._end_decode_part(gen)

    @staticmethod
    def _length_final(gen: Generation) -> TokenDelta:
        n, prompt = len(gen.outputs.delivered), len(gen.request.prompt_token_ids)
        return TokenDelta(gen.request_id, 0, (), True, "length", prompt + n, 0)

    async def drain_aborts(self) -> None:
        """Wait for the aborts already sent (shutdown, tests)."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)
