"""One record per request on a prefill worker, with a phase and the events that move it.

    prefill, its grammar not compiled yet ──► COMPILING ── compiled ──► queued as below
                                               │ (runtime.grammar_compiles)
                                               └── invalid grammar, abort ──► (gone: the call refused)

    prefill ──► QUEUED ── the forward that completes its prompt starts ──► SENDING ── every transfer done ──► (gone)
    (engine      │        (transfers opened before it, layers shipped        │        blocks released, still
     computes    │         as they are written; first token handed over)     │        prefix-cached
     its chunks) │                                                           │
                 │ abort, step failed                                        │ transfer failed or expired,
                 ▼                                                           │ abort, step failed
               (gone: blocks released; a failure tells decode PrefillFailed) ▼
                                                     RELEASING ── every rank let go ──► (gone: blocks released;
                                                                                        a failure tells decode)

From SENDING the blocks are read by this rank's I/O thread and by each
follower rank: RELEASING waits until each acknowledged the release (a follower
that does not within the ack timeout is logged and let go of) before the
blocks return to the pool. What moves a record is `PrefillWorker.transitions`; an event a phase
does not list is late news and is ignored.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from engine.request import Request
from runtime.control_service import Call
from wire.requests import PrefillTask


class Phase(enum.Enum):
    COMPILING = "compiling"
    QUEUED = "queued"
    SENDING = "sending"
    RELEASING = "releasing"


class Event(enum.Enum):
    GRAMMAR_COMPILED = "grammar_compiled"  # its grammar compiled (or failed to) on the compile thread
    SENDING = "sending"  # the forward that completes its prompt starts (its transfers are opened)
    TRANSFER_DONE = "transfer_done"  # one (rank, decode address) transfer of it ended well
    TRANSFER_FAILED = "transfer_failed"  # one failed, expired, or could not start
    ABORT = "abort"  # the client (through the router), the router's lease, or shutdown
    STEP_FAILED = "step_failed"
    RELEASED = "released"  # one rank let go of its blocks
    ACK_TIMEOUT = "ack_timeout"  # a follower rank did not acknowledge the release in time


@dataclass
class PrefillRecord:
    task: PrefillTask
    # the engine's: its blocks are this worker's to release once no transfer reads them (None: COMPILING)
    request: Request | None
    phase: Phase = Phase.QUEUED
    call: Call | None = None  # COMPILING: the prefill call, answered once it is queued (or refused)
    transfers: set[tuple[int, str]] = field(default_factory=set)  # SENDING: (rank, decode address) still moving
    holders: set[int] = field(default_factory=set)  # RELEASING: ranks (0: this one) yet to let go of its blocks
    tell_decode: bool = False  # RELEASING: a failure decode must hear of (PrefillFailed), not an abort
    reason: str = ""
    deadline: float | None = None  # RELEASING: for the followers' acks

    @property
    def request_id(self) -> str:
        return self.task.request.request_id
