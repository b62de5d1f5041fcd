"""One record per request on a decode worker, with a phase and the events that move it.

    reserve, its grammar not compiled yet ──► COMPILING ── compiled ──► taken as one of the reserves below
                                               │ (runtime.grammar_compiles)
                                               └── invalid grammar, abort ──► (gone: reserve refused)

                     reserve (local prefill) ─────────────────────────────────────┐
                     reserve (remote KV)                                          ▼
    EXPECTING_SHARDS ── acked ──► AWAITING_KV ── KV, shards, first token all in ──► RUNNING ── finished ──► (gone)
     (TP: every rank           │  (admitted when the batch has a seat)             │
      acks its reservation)    │                                                    │ abort, step failed
            │                  │ transfer failed (recompute) ──► RELEASING ──► RUNNING (prefilled here)
            │ ack timeout,     │ transfer failed (fail), abort, no first token,    │
            │ abort            │ router lease ──────────────────► RELEASING ──► (gone: blocks freed, final delta)
            └──────────────────┴──► RELEASING ──► (gone: reserve refused, blocks freed)

RELEASING waits until nobody may write the request's blocks any more: rank 0's
receiver and each follower rank acknowledge the release (a follower that does
not within the ack timeout is logged and let go of); then the blocks go back
to the pool (and the request is prefilled here, or ends). Every failure is
one entry of `DecodeWorker.transitions`; an event a phase does not list is late news (a KV
chunk after an abort, a first token after a failure) and is ignored.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from engine.request import Request
from wire.requests import DecodeReservation, GenerateRequest
from runtime.control_service import Call


class Phase(enum.Enum):
    COMPILING = "compiling"
    EXPECTING_SHARDS = "expecting_shards"
    AWAITING_KV = "awaiting_kv"
    RUNNING = "running"
    RELEASING = "releasing"


class Event(enum.Enum):
    GRAMMAR_COMPILED = "grammar_compiled"  # its grammar compiled (or failed to) on the compile thread
    RANK_ACKED = "rank_acked"  # a follower rank acknowledged its reservation
    ACK_TIMEOUT = "ack_timeout"  # a follower rank did not acknowledge (a reservation or a release) in time
    KV_DONE = "kv_done"  # rank 0's receiver has the whole prompt
    SHARD_DONE = "shard_done"  # a follower's receiver has its heads of it
    FIRST_TOKEN = "first_token"
    SEAT_OFFERED = "seat_offered"  # ready (KV on every rank, first token here): a seat in the batch if one is free
    KV_FAILED = "kv_failed"  # rank 0's transfer, a follower's shard, or the prefill itself failed
    NO_FIRST_TOKEN = "no_first_token"  # the KV landed but the prefill worker's first token never came
    ABORT = "abort"  # the client, the router's lease, or shutdown
    STEP_FAILED = "step_failed"
    FINISHED = "finished"
    RELEASED = "released"  # one holder of its blocks let go


@dataclass
class DecodeRecord:
    """Everything this worker knows of one request beyond the engine's `Request`."""

    request_id: str
    stream_address: str  # where its TokenDeltas go
    num_prompt_tokens: int
    phase: Phase
    call: Call | None = None  # a reserve still to answer (COMPILING; tensor parallel: once every rank acked)
    reservation: DecodeReservation | None = None  # what that answer says
    asked: GenerateRequest | None = None  # COMPILING: the reserve to take once its grammar is compiled
    deadline: float | None = None  # EXPECTING_SHARDS: for the acks; AWAITING_KV with KV landed: for the first token
    first_token: int | None = None
    kv_landed: bool = False  # rank 0's share of the prompt's KV is in the cache
    shards_missing: set[int] = field(default_factory=set)  # follower ranks whose share has not landed
    unacked: set[int] = field(default_factory=set)  # EXPECTING_SHARDS: ranks yet to acknowledge
    holders: set[int] = field(default_factory=set)  # RELEASING: ranks (0: this one) yet to let go of its blocks
    then: str = ""  # RELEASING: what follows ("recompute", "end" or "refused")
    reason: str = ""  # why it is ending (sent with the final delta)
    spliced: int = 0  # tokens streamed before it was prefilled here after a failed transfer
    num_output: int = 0  # output tokens the client has been sent (a final error delta says how many)
    # For the phases its final delta reports (engine clock): the engine's request, when its first token and
    # (the last share of) its KV arrived, when it joined the running batch (None: prefilled here).
    request: Request | None = None
    first_token_seen: float | None = None
    kv_landed_at: float | None = None
    admitted_at: float | None = None

    @property
    def ready(self) -> bool:
        """Everything for admission is here: the KV on every rank and the first token."""
        return self.kv_landed and not self.shards_missing and self.first_token is not None
