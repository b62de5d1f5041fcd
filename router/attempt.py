"""One attempt of a dispatched request on its workers, and what it holds of them.

An attempt is one handoff of a request to a decode worker and, unless decode computes the prompt itself,
a prefill worker. While it runs it holds counts on those workers' `WorkerState`s (what the routing
policies and the TTFT prediction read): `in_flight` on each worker whose part is not over, and the
prompt's tokens in `prompt_tokens_queued` of the worker computing it until its first token is out.
Those counts are a function of the attempt's phase alone (`HOLDS`): a transition takes what the new phase
holds and gives back what the old one held and the new one does not, so each count goes back exactly once
however the attempt ends.

    phase            decode  prefill  prompt charged to   left by
    PREFILL_REMOTE   held    held     prefill             prefill_locally, first token, second token, end
    PREFILL_LOCAL    held    -        decode              first token, end
    KV_ARRIVING      held    held     -                   second token (decode's first: the KV landed), end
    DECODING         held    -        -                   end
    ENDED            -       -        -                   (the last phase)

A prefill worker's part ends when decode makes a token (the prompt's KV landed there): until then a
prefill worker that dies takes the attempt with it. The router's dispatcher (`router.dispatch`) and the
simulator's router (`planner.sim.router`) both keep their counts through this record.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from router.worker_state import WorkerState


class AttemptPhase(Enum):
    PREFILL_REMOTE = "prefill_remote"  # a prefill worker computes the prompt; decode waits for its KV
    PREFILL_LOCAL = "prefill_local"  # decode computes the prompt itself (colocated, or no prefill worker)
    KV_ARRIVING = "kv_arriving"  # the first token is out; the prompt's KV is on its way to decode
    DECODING = "decoding"  # decode made a token: prefill's part is over
    ENDED = "ended"  # finished, aborted or given up: nothing held


@dataclass(frozen=True)
class Holds:
    decode: bool
    prefill: bool
    charged: str | None  # "prefill" / "decode": whose prompt_tokens_queued carries the prompt


HOLDS = {
    AttemptPhase.PREFILL_REMOTE: Holds(decode=True, prefill=True, charged="prefill"),
    AttemptPhase.PREFILL_LOCAL: Holds(decode=True, prefill=False, charged="decode"),
    AttemptPhase.KV_ARRIVING: Holds(decode=True, prefill=True, charged=None),
    AttemptPhase.DECODING: Holds(decode=True, prefill=False, charged=None),
    AttemptPhase.ENDED: Holds(decode=False, prefill=False, charged=None),
}

# (phase, event) -> next phase. An event a phase has no entry for leaves it as it is (tokens keep coming
# while DECODING; a second token's event repeats with every chunk).
TRANSITIONS = {
    (AttemptPhase.PREFILL_REMOTE, "prefill_locally"): AttemptPhase.PREFILL_LOCAL,
    (AttemptPhase.PREFILL_REMOTE, "first_token"): AttemptPhase.KV_ARRIVING,
    (AttemptPhase.PREFILL_REMOTE, "second_token"): AttemptPhase.DECODING,  # both arrived in one chunk
    (AttemptPhase.PREFILL_LOCAL, "first_token"): AttemptPhase.DECODING,
    (AttemptPhase.PREFILL_LOCAL, "second_token"): AttemptPhase.DECODING,
    (AttemptPhase.KV_ARRIVING, "second_token"): AttemptPhase.DECODING,
    **{(phase, "end"): AttemptPhase.ENDED for phase in AttemptPhase},
}


class Attempt:
    """Owns the counts described above for one attempt; created on dispatch, `end()`ed exactly when the
    attempt is over (finished, aborted, given up). `decode` and `prefill` stay the attempt's workers
    (None: decode prefills) whatever the phase; `holding_prefill` is the prefill worker while its part runs."""

    def __init__(self, request_id: str, decode: WorkerState, prefill: WorkerState | None, prompt_tokens: int):
        self.request_id, self.decode, self.prefill = request_id, decode, prefill
        self.prompt_tokens = prompt_tokens
        self.phase = AttemptPhase.ENDED
        self._enter(AttemptPhase.PREFILL_REMOTE if prefill is not None else AttemptPhase.PREFILL_LOCAL)

    @property
    def holding_prefill(self) -> WorkerState | None:
        return self.prefill if HOLDS[self.phase].prefill else None

    @property
    def ended(self) -> bool:
        return self.phase is AttemptPhase.ENDED

    @property
    def workers(self) -> list[WorkerState]:
        """Its workers whose part is not over (decode first)."""
        return [w for w in (self.decode if HOLDS[self.phase].decode else None, self.holding_prefill) if w]

    def prefill_locally(self) -> None:
        """Decode took the prompt to compute itself (its reservation said so)."""
        self._event("prefill_locally")

    def tokens_out(self, count: int) -> None:
        """`count` tokens of this attempt have been handed out so far (the first is the prompt's)."""
        if count >= 1:
            self._event("first_token")
        if count >= 2:
            self._event("second_token")

    def end(self) -> None:
        """Idempotent: everything it holds goes back."""
        self._event("end")

    def _event(self, event: str) -> None:
        self._enter(TRANSITIONS.get((self.phase, event), self.phase))

    def _enter(self, phase: AttemptPhase) -> None:
        old, new = HOLDS[self.phase], HOLDS[phase]
        self.phase = phase
        if old.decode != new.decode:
            self.decode.in_flight += 1 if new.decode else -1
        if self.prefill is not None and old.prefill != new.prefill:
            self.prefill.in_flight += 1 if new.prefill else -1
        if old.charged != new.charged:
            self._charge(old.charged, -self.prompt_tokens)
            self._charge(new.charged, self.prompt_tokens)

    def _charge(self, role: str | None, tokens: int) -> None:
        worker = {"prefill": self.prefill, "decode": self.decode}.get(role) if role else None
        if worker is not None:
            worker.prompt_tokens_queued += tokens
