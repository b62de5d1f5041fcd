"""The simulated router: Tandem's own registry, routing policies, local-prefill rule and admission, on the
handoff of `router.dispatch` / `router.handoff` replayed on simulated time.

    arrival (+ request_s: HTTP, tokenize)
      admit: max_in_flight sequences, else refused (429); the TTFT prediction, else refused (429)
      route: decode by `registry.pick_decode` (by the prompt's policy when colocated), prefill by
             `router.local_prefill.choose_prefill` (none: colocated, or decode prefills it itself); the counts
             it holds on them kept by `router.attempt.Attempt`, as the real dispatcher keeps them
      reserve on decode (a hop each way); refused while full: again after `retry_after` (doubling) until
             `reserve_wait_s`, then the request fails; prefill_locally: prefill's part is over at once
      PrefillTask to the prefill worker (a hop)
    token deltas (a hop from the worker, + per_delta_s to the client)
      the first token settles the prompt's charge; decode's first token, or the final one, ends prefill's part
      the final delta ends decode's part

Loads: every `load_refresh_s` each worker's last published `WorkerLoad` is read, as the router's polls do.
Workers never die here: resumes and liveness have nothing to do.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.layout import RouterKnobs
from planner.sim.events import EventQueue
from planner.sim.messages import Prefill, Refused, Reserve, Reserved
from planner.sim.worker import SimWorker
from router.attempt import Attempt
from router.local_prefill import choose_prefill
from router.policy import make_pool_policies
from router.registry import WorkerRegistry
from router.ttft_prediction import FirstTokenTooLate, check_ttft
from router.worker_state import WorkerState


@dataclass
class ClientRequest:
    """One request as the client sees it: `vllm bench serve`'s per-request outcome (`bench_metrics.RequestOutput`)."""

    prompt: tuple[int, ...]  # dropped once the request ends (a long trace's prompts need not all be held)
    output_len: int
    arrival_s: float
    prompt_len: int = 0
    start_time: float = 0.0  # sent
    success: bool = False
    ttft: float = 0.0
    latency: float = 0.0
    output_tokens: int = 0
    error: str = ""
    token_times: list[float] = field(default_factory=list)  # when the client saw each token
    on_end: object = None  # the client's callback

    def __post_init__(self):
        self.prompt_len = len(self.prompt)

    @property
    def itl(self) -> list[float]:
        times = self.token_times
        return [b - a for a, b in zip(times, times[1:])]


@dataclass
class Dispatch:
    """The router's record of one dispatched request: where it runs and what it holds on each worker."""

    client: ClientRequest
    attempt: Attempt  # its workers and the counts it holds on them
    started_at: float
    tokens: int = 0  # delivered so far
    refusals: int = 0  # decode's retryable refusals of its reserve so far

    @property
    def request_id(self) -> str:
        return self.attempt.request_id


class SimRouter:
    def __init__(self, events: EventQueue, workers: list[SimWorker], knobs: RouterKnobs, block_size: int,
                 colocated: bool):  # fmt: skip
        options = {"block_size": block_size} if knobs.routing_policy == "cache_aware" else {}
        self.registry = WorkerRegistry(*make_pool_policies(knobs.routing_policy, options, block_size, colocated))
        self.events, self.knobs, self.colocated = events, knobs, colocated
        self.workers = {w.name: w for w in workers}
        for w in workers:
            self.registry.register(w.name, w.role, w)
            w.router = self
        self.serving = workers[0].serving
        self.active: dict[str, Dispatch] = {}
        self.sequences_in_flight = 0
        self.refused = 0
        self._ids = 0
        self._refresh()

    # ---- loads ----------------------------------------------------------------------
    def _refresh(self) -> None:
        for state in self.registry.workers.values():
            state.load = self.workers[state.name].load
            state.prompt_rate.observe(state.load)

    def start_polling(self) -> None:
        self._refresh()
        self.events.after(self.knobs.load_refresh_s, self.start_polling)

    # ---- a request's way in ---------------------------------------------------------
    def submit(self, client: ClientRequest) -> None:
        """The client sends `client` now."""
        self.events.after(self.serving.request_s, self._admit, client)

    def _admit(self, client: ClientRequest) -> None:
        if self.sequences_in_flight >= self.knobs.max_in_flight:
            return self._end(client, "429: the server holds max_in_flight sequences")
        try:
            check_ttft(self._prompt_workers(), len(client.prompt), self.knobs.max_predicted_ttft_s)
        except FirstTokenTooLate as err:
            return self._end(client, f"429: {err}")
        decode = self.registry.pick_decode(client.prompt)
        prefill = None
        if not self.colocated:
            prefill, _ = choose_prefill(self.registry, self.knobs.local_prefill, client.prompt, decode)
        self._ids += 1
        d = Dispatch(client, Attempt(f"sim-{self._ids}", decode, prefill, len(client.prompt)), self.events.now)
        self.active[d.request_id] = d
        self.sequences_in_flight += 1
        self._reserve(d)

    def _prompt_workers(self) -> list[WorkerState]:
        prefill = [] if self.colocated else self.registry.pickable("prefill")
        return prefill or self.registry.pickable("decode")

    def _reserve(self, d: Dispatch) -> None:
        message = Reserve(d.request_id, d.client.prompt, d.client.output_len, local_prefill=d.attempt.prefill is None)
        self.events.after(self.serving.message_s, self.workers[d.attempt.decode.name].post, message)

    def reserved(self, request_id: str, reply) -> None:
        """Decode's answer to a reserve arrives."""
        d = self.active[request_id]
        if isinstance(reply, Refused):
            waited = self.events.now - d.started_at
            if reply.retryable and waited < self.knobs.handoff.reserve_wait_s:
                d.refusals += 1
                return self.events.after(self.knobs.handoff.retry_after(d.refusals), self._reserve, d)
            return self._fail(d, f"decode refused it: {reply.reason}")
        assert isinstance(reply, Reserved)
        if reply.prefill_locally:
            return d.attempt.prefill_locally()
        task = Prefill(request_id, d.client.prompt, d.client.output_len, self.workers[d.attempt.decode.name],
                       reply.uncached_tokens)  # fmt: skip
        self.events.after(self.serving.message_s, self.workers[d.attempt.prefill.name].post, task)

    # ---- tokens out -------------------------------------------------------------------
    def deltas(self, deltas: list[tuple[str, int, bool]]) -> None:
        """A decode step's token deltas arrive together: (request id, tokens, finished) each."""
        for request_id, tokens, finished in deltas:
            self.delta(request_id, tokens, finished)

    def delta(self, request_id: str, tokens: int, finished: bool) -> None:
        """A worker's token delta arrives; the client sees it `per_delta_s` later."""
        d = self.active[request_id]
        if tokens:
            d.tokens += tokens
            seen = self.events.now + self.serving.per_delta_s
            d.client.token_times.append(seen)
            d.attempt.tokens_out(d.tokens)
        if finished:
            d.attempt.end()
            del self.active[request_id]
            self.sequences_in_flight -= 1
            self._finish(d.client)

    def _fail(self, d: Dispatch, why: str) -> None:
        d.attempt.end()
        del self.active[d.request_id]
        self.sequences_in_flight -= 1
        self._end(d.client, why)

    def _finish(self, client: ClientRequest) -> None:
        times = client.token_times
        client.success, client.output_tokens = True, len(times)
        client.ttft, client.latency = times[0] - client.start_time, times[-1] - client.start_time
        client.prompt = ()
        client.on_end(client)

    def _end(self, client: ClientRequest, why: str) -> None:
        if why.startswith("429"):
            self.refused += 1
        client.error = why
        client.latency = self.events.now - client.start_time
        client.prompt = ()
        client.on_end(client)
