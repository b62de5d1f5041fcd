"""What both roles' loop workers share: one record per request, moved only by a transition table, and the
protocol around it that is the same for prefill and decode.

A role's worker keeps `records` (request id -> its record, which has a `phase`)
and a class-level `transitions` table, phase -> {event: the role's method
`(self, record, event, reason=..., **facts)` that makes the transition}.
`on(request_id, event, ...)` is the only way a record changes phase: an event
its phase does not list is late news (a KV chunk after an abort, a transfer's
end after a failure) and is ignored, so every failure path is one table entry.
Calls from the router or a lifecycle caller arrive as `Call`s and go to the
method their name says (`calls`). A worker holds its requests for the router
under a `lease` (`runtime.router_lease`): when the router stops calling, every
record gets the role's `ABORT`.

Shared here, once: the loop's messages and the follower ranks' news, the
compile thread of structured-output grammars (`compiles`: a request whose
grammar is not cached waits in the role's COMPILING phase, never on this
thread, and hears GRAMMAR_COMPILED), the
router's abort, attaching the follower ranks, when the loop may step
(`runtime.arrival_window`) and its next timer, a step whose failure ends its
requests, overdue records (`overdue`, the role's event and reason for each), and
the release of a request's blocks by every rank that may touch them:
`start_release` asks this rank's I/O thread and each follower to let go,
`let_go` counts their acknowledgements (a follower that does not answer within
the ack timeout is logged and let go of). Every event is the role's (`events`);
each role's `close` calls `close_shared` (the compile thread, the step trace).
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from engine.llm_engine import EngineStepError, LLMEngine
from engine.outputs import RequestOutput
from runtime.arrival_window import ArrivalWindow
from runtime.control_service import Call
from runtime.grammar_compiles import CompilesFull, GrammarCompiled, GrammarCompiles
from runtime.load_board import LoadBoard
from runtime.loop import LoopWorker
from runtime.rank_links import RankLinks
from runtime.router_lease import RouterLease, due
from runtime.step_threads import StepThreads
from runtime.step_trace import step_trace_from_env
from runtime.transfer_service import Released
from runtime.worker_config import WorkerConfig
from wire.codec import decode
from wire.ranks import DropShard, RankEndpoint, TransferEnded
from wire.requests import ReserveRefused

logger = logging.getLogger("tandem.worker")


class RequestTable(LoopWorker):
    transitions: dict = {}  # phase -> {event: the role's transition method}
    # the role's Event enum: ABORT, STEP_FAILED, ACK_TIMEOUT, RELEASED, GRAMMAR_COMPILED (decode: RANK_ACKED too)
    events = None

    def __init__(self, engine: LLMEngine, config: WorkerConfig, io, board: LoadBoard, control_address: str = "", *,
                 deliver: Callable[[object], None]):  # fmt: skip
        """`io`: the I/O thread (anything with `post(command)`), owned and closed by the worker; `control_address`:
        where the router calls it (its I/O thread's control socket); `deliver`: posts a message to this worker's
        loop from any thread (`runtime.loop.WorkerLoop.post`; a test driving the worker itself passes its own)."""
        self.engine, self.config, self.io, self.board = engine, config, io, board
        self.control_address = control_address
        self.compiles = GrammarCompiles(engine.grammars, deliver, config.name, config.grammar_compile_timeout_s,
                                        config.max_grammar_compiles_waiting)  # fmt: skip
        self.step_threads = StepThreads()  # built on the loop thread (`runtime.loop.WorkerLoop`)
        self.trace = step_trace_from_env(engine, config.name)  # TANDEM_STEP_TRACE: each step's shape and time
        self.tp_size = engine.config.parallel.tp_size
        self.ranks: RankLinks | None = None  # tensor parallel: links to the follower ranks
        self.records: dict = {}  # insertion order: oldest first
        self.failure_attributed = False  # the last failed step was a request's fault (`failed_step`)
        self.lease = RouterLease(board, config.router_lease_s)
        self.window = ArrivalWindow(config.arrival_window)  # holds an idle engine's first step for a burst
        self.calls: dict[str, Callable[[Call], None]] = {
            "is_clean": self.is_clean, "abort": self.abort, "attach_followers": self.attach_followers,
        }  # fmt: skip

    def on(self, request_id: str, event, reason: str = "", **facts) -> None:
        record = self.records.get(request_id)
        transition = self.transitions.get(record.phase, {}).get(event) if record is not None else None
        if transition is not None:  # else late news for a phase that no longer cares
            transition(self, record, event, reason=reason, **facts)

    def abort(self, call: Call) -> None:
        self.on(call.arg, self.events.ABORT, "aborted by the client")
        call.answer(None)

    def attach_followers(self, call: Call) -> None:
        """Tensor parallel: reach the follower ranks (`RankEndpoint`s, encoded), one for each of ranks 1..tp-1."""
        ranks = [decode(e, RankEndpoint) for e in call.arg]
        if sorted(r.rank for r in ranks) != list(range(1, self.tp_size)):
            raise ValueError(f"expected endpoints of ranks 1..{self.tp_size - 1}, got {[r.rank for r in ranks]}")
        self.ranks = RankLinks(ranks, self.config.rank_ack_timeout_s, self.config.bind_address)
        call.answer(None)

    # ---- the loop's (runtime.loop.LoopWorker) -------------------------------------------
    def handle(self, message) -> None:
        if isinstance(message, Call):
            try:
                self.calls[message.method](message)
            except Exception as err:  # ValueError: the caller's fault; anything else a bug the caller hears of
                message.answer(None, err)
        elif isinstance(message, TransferEnded):
            self._transfer_ended(message)
        elif isinstance(message, Released):
            self.on(message.request_id, self.events.RELEASED, rank=message.rank)
        elif isinstance(message, GrammarCompiled):
            self.on(message.request_id, self.events.GRAMMAR_COMPILED, grammar=message.grammar, error=message.error)

    def sockets(self) -> list:
        return [self.ranks.socket] if self.ranks is not None else []

    def read_sockets(self) -> None:
        """The follower ranks' news: an acknowledgement (decode's ExpectShard, or a DropShard: they let go), or
        the end of their part of a transfer."""
        for msg in self.ranks.read() if self.ranks is not None else ():
            if isinstance(msg, TransferEnded):
                self._transfer_ended(msg)
            else:  # RankAck
                event = self.events.RANK_ACKED if msg.kind == "ExpectShard" else self.events.RELEASED
                self.on(msg.request_id, event, rank=msg.rank)

    def _transfer_ended(self, ended: TransferEnded) -> None:
        """A transfer ended on this rank or a follower (the role's event for it)."""
        raise NotImplementedError

    def has_work(self) -> bool:
        return self.window.lets_step(self.engine)

    def next_deadline(self) -> float | None:
        return self.window.deadline(self.lease.next_deadline(self.records.values()))

    def engine_step(self) -> list[RequestOutput] | None:
        """One engine step's outputs; None when it failed (the engine ended the requests it names and freed what
        they held; each record hears STEP_FAILED; `failed_step` says whose failure it was)."""
        self.step_threads.leave_one(self.compiles.busy)
        try:
            return self.trace.step(self.engine.step) if self.trace is not None else self.engine.step()
        except EngineStepError as err:
            self.failure_attributed = err.attributed
            for request_id in err.request_ids:
                self.on(request_id, self.events.STEP_FAILED, str(err))
            return None

    def start_compile(self, call: Call, request_id: str, structured: tuple[str, str]) -> bool:
        """Compile `structured` off the loop (`GrammarCompiles.start`: GRAMMAR_COMPILED comes back); False when
        the compiles are full: `call` is answered with a busy refusal (503 at the router), nothing kept."""
        try:
            self.compiles.start(request_id, structured)
        except CompilesFull as err:
            call.answer(ReserveRefused(request_id, str(err), retryable=True, busy=True))
            return False
        return True

    def close_shared(self) -> None:
        """What every role's `close` ends first: the grammar compile thread and, when on, the step trace's file."""
        self.compiles.close()
        if self.trace is not None:
            self.trace.close()

    def failed_step(self) -> bool | None:
        """What the loop counts for the step that just failed (`runtime.loop.LoopWorker.step`): False, this
        worker's failure; None when the engine attributes it to the one suspect request it ran alone, that
        request's: neither a failure in a row of this worker (`LoadBoard`) nor a success that resets them."""
        return None if self.failure_attributed else False

    def check_deadlines(self, now: float | None = None) -> None:
        """End what is overdue at `now` (monotonic seconds; None: now): everything once the router is gone."""
        now = time.monotonic() if now is None else now
        if self.records and self.lease.expired(now):
            for request_id in list(self.records):
                self.on(request_id, self.events.ABORT, self.lease.reason)
        for record in due(self.records.values(), now):
            self.on(record.request_id, *self.overdue(record))

    def overdue(self, record) -> tuple[object, str]:
        """The event a record past its deadline gets, and why (the role's)."""
        raise NotImplementedError

    # ---- releasing a request's blocks: every rank lets go first ---------------------------
    def start_release(self, record, command, reason: str) -> None:
        """Ask everyone who may still touch `record`'s blocks to let go: this rank's I/O thread (`command`) and
        each follower rank (DropShard); each answers with the role's release event (`let_go`)."""
        record.holders = {0, *(self.ranks.ranks if self.ranks is not None else ())}
        record.deadline = time.monotonic() + self.config.rank_ack_timeout_s
        self.io.post(command)
        if self.ranks is not None:
            self.ranks.tell(DropShard(record.request_id, reason))

    def let_go(self, record, event, reason: str, rank: int | None) -> bool:
        """`rank` let go of `record`'s blocks (or the acks timed out: every holder is let go of, logged); True once
        nobody holds them: they may go back to the pool."""
        if event is self.events.ACK_TIMEOUT:
            logger.error("freeing the blocks of %s anyway: %s", record.request_id, reason)
            record.holders.clear()
        record.holders.discard(rank)
        return not record.holders

    def is_clean(self, call: Call) -> None:
        snap = self.snapshot()
        call.answer(snap.idle and snap.pool_all_free)
