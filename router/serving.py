"""What both OpenAI endpoints share: admission, fan-out of prompts x n, and one merged stream of choice updates.

    RequestRunner.start(prompts, sampling, text, n)  admit (or 429), dispatch every sequence (or fail all)
    async for update in running.updates():          text deltas of every choice, as they come, in any order
    running.close()                                  always (finally): aborts what is unfinished, releases admission

Choice `i` is prompt `i // n`, sample `i % n`, as OpenAI numbers them. Each choice's text is made here,
from its tokens (`router.choice_output`): the workers get `sampling`, never `text`; a choice that meets
one of its stop strings is ended here and aborted on its workers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass, field
from typing import AsyncIterator

from output_text import TextOptions
from router.limits import RequestLimits
from router.choice_output import ChoiceOutput, ChoiceUpdate
from router.dispatch import Dispatcher, Generation
from router.errors import APIError, from_dispatch, internal_error
from router.metrics import RouterMetrics
from router.phases import RequestPhases
from router.served_model import ServedModel
from wire.requests import SamplingSpec, TokenDelta


class Admission:
    """At most `limit` sequences in flight; beyond it a request is refused at once (429) rather than queued.

    This is the bound of every queue behind the router: the prefill and decode workers' waiting
    queues, the decode inboxes and the token stream's per-request queues only ever hold admitted
    sequences (the workers' queues hold no more than all of them; each per-request queue no more
    than its own output), so a flood of requests costs the router a 429 each, nothing more.

    Closed (`close`, when the server is going away) it refuses every new request (503) while what it
    admitted runs to its end: `in_use` says how much is left."""

    def __init__(self, limit: int, retry_after_s: int):
        self.limit, self.retry_after_s, self.in_use = limit, retry_after_s, 0
        self.closed_because: str | None = None

    def admit(self, n: int) -> None:
        self.check_open()
        if self.in_use + n > self.limit:
            raise APIError(429, f"the server is at its limit of {self.limit} sequences in flight; retry later",
                           code="too_many_requests", headers={"Retry-After": str(self.retry_after_s)})  # fmt: skip
        self.in_use += n

    def release(self, n: int) -> None:
        self.in_use -= n

    def close(self, reason: str) -> None:
        """Admit nothing more (503 `reason`); once: a later close keeps the first reason."""
        self.closed_because = self.closed_because or reason

    def check_open(self) -> None:
        if self.closed_because is not None:
            raise APIError(503, self.closed_because, code="shutting_down")


@dataclass
class _Choice:
    index: int
    generation: Generation
    output: ChoiceOutput
    first_token_at: float | None = None
    final: TokenDelta | None = None
    phases: RequestPhases | None = None  # once finished


@dataclass
class RunningRequest:
    choices: list[_Choice]
    prompt_lengths: list[int]
    arrived: float
    runner: "RequestRunner" = field(repr=False)
    _closed: bool = False

    async def updates(self) -> AsyncIterator[ChoiceUpdate]:
        """Every choice's updates until all finished; raises `APIError` if one fails (the rest are aborted)."""
        if len(self.choices) == 1:
            async for update in self._choice_updates(self.choices[0]):
                yield update
            return
        queue: asyncio.Queue = asyncio.Queue()
        tasks = [asyncio.create_task(self._pump(c, queue)) for c in self.choices]
        try:
            for _ in self.choices:
                while (item := await queue.get()) is not None:
                    if isinstance(item, BaseException):
                        raise item
                    yield item
        finally:
            for task in tasks:
                task.cancel()

    async def _pump(self, choice: _Choice, queue: asyncio.Queue) -> None:
        try:
            async for update in self._choice_updates(choice):
                queue.put_nowait(update)
            queue.put_nowait(None)
        except Exception as err:
            queue.put_nowait(err)

    async def _choice_updates(self, choice: _Choice) -> AsyncIterator[ChoiceUpdate]:
        try:
            async for chunk in choice.generation.chunks():
                if choice.first_token_at is None and chunk.token_ids:
                    choice.first_token_at = time.monotonic()
                update = choice.output.update(chunk)
                if update.final is not None:
                    self._finish(choice, update.final)
                yield update
                if update.final is not None:
                    return
        except APIError:
            raise
        except Exception as err:
            raise from_dispatch(err) from None

    def _finish(self, choice: _Choice, final: TokenDelta) -> None:
        if final.finish_reason == "abort":
            raise internal_error(_public_cause(final.error), final.error or "aborted", code="worker_error")
        choice.final = final
        if not choice.generation.finished:
            choice.generation.close()  # a stop string ended it here, not its worker: abort it there
        now = time.monotonic()
        first = choice.first_token_at if choice.first_token_at is not None else now
        choice.phases = RequestPhases.of(now - self.arrived, first - self.arrived,
                                         choice.generation.prompt_phases, final.phases)  # fmt: skip
        self.runner.metrics.sequence_finished(self.arrived, choice.first_token_at, final, choice.phases, now)

    def phases(self) -> list[dict[str, float]]:
        """Each finished choice's phases (`router.phases`), in choice order: the response's `phases`."""
        return [c.phases.to_dict() for c in self.choices if c.phases is not None]

    def usage(self) -> dict:
        completion = sum(c.final.num_output_tokens for c in self.choices if c.final is not None)
        prompt = sum(self.prompt_lengths)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def close(self) -> None:
        """Idempotent: aborts unfinished choices on their workers and gives their admission back."""
        if self._closed:
            return
        self._closed = True
        for choice in self.choices:
            if choice.final is None:
                self.runner.metrics.finished.labels("abort").inc()  # ended before its final delta (client gone, error)
            choice.generation.close()
        self.runner.admission.release(len(self.choices))


class RequestRunner:
    def __init__(self, dispatcher: Dispatcher, model: ServedModel, admission: Admission, metrics: RouterMetrics,
                 limits: RequestLimits = RequestLimits(), max_stream_backlog_bytes: int = 4 << 20):  # fmt: skip
        self.dispatcher, self.model, self.admission, self.metrics = dispatcher, model, admission, metrics
        self.limits = limits  # checked by the endpoints before any work (router.limits)
        self.max_stream_backlog_bytes = max_stream_backlog_bytes  # how far a streaming client may lag (sse_stream)

    async def start(self, prompts: list[list[int]], sampling: SamplingSpec, text: TextOptions, n: int,
                    arrived: float, max_tokens: list[int]) -> RunningRequest:  # fmt: skip
        """Dispatch n sequences per prompt (prompt i gets `max_tokens[i]`); raises `APIError`, holding nothing."""
        self.admission.admit(len(prompts) * n)
        plan = [(i * n + j, prompt, max_tokens[i]) for i, prompt in enumerate(prompts) for j in range(n)]
        specs = [self._spec(sampling, limit, j) for (j, _, limit) in plan]
        try:
            starts = (self.dispatcher.start(prompt, spec) for (_, prompt, _), spec in zip(plan, specs))
            started = await asyncio.gather(*starts, return_exceptions=True)
        except BaseException:  # cancelled (client gone): each start cleaned up after itself
            self.admission.release(len(plan))
            raise
        generations = [g for g in started if isinstance(g, Generation)]
        if len(generations) < len(started):
            for gen in generations:
                gen.close()
            self.admission.release(len(plan))
            raise from_dispatch(next(e for e in started if not isinstance(e, Generation)))
        choices = [_Choice(index, gen, ChoiceOutput(index, gen.request, self.model.text_stream(prompt, text)))
                   for (index, prompt, _), gen in zip(plan, generations)]  # fmt: skip
        return RunningRequest(choices, [len(p) for p in prompts], arrived, self)

    @staticmethod
    def _spec(sampling: SamplingSpec, max_tokens: int, choice_index: int) -> SamplingSpec:
        # n samples of one prompt must differ: each gets its own seed derived from the request's.
        seed = None if sampling.seed is None or choice_index == 0 else (sampling.seed + choice_index) % 2**63
        return dataclasses.replace(sampling, max_tokens=max_tokens, seed=seed)


# Worker errors whose kind the client may know (with `kv_transfer_failure: fail`, its request's KV
# transfer or prefill failed); the worker's own words (addresses, internals) go to the log only.
_PUBLIC_CAUSES = {"KV transfer": "its KV transfer failed", "prefill failed": "its prefill failed"}


def _public_cause(error: str | None) -> str:
    cause = next((public for prefix, public in _PUBLIC_CAUSES.items() if (error or "").startswith(prefix)), None)
    return f"generation failed on a worker: {cause}" if cause else "generation failed on a worker"
