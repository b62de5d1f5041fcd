"""A worker's structured-output grammars are compiled off its loop thread.

    loop thread (runtime.loop)                      the worker's compile thread (one)
    a request asks for a grammar:
      in the engine's cache -> taken at once
      not yet -> its record waits (COMPILING),
                 `start` ─────────────────────────► the cache again, else: compiled in the child
                                                     process (runtime.grammar_child: killed past its
                                                     timeout), then here (engine.grammars.compiled)
    GrammarCompiled(request_id, grammar | error) ◄── deliver ──┘
      -> the record's GRAMMAR_COMPILED event: the request is taken with that grammar, or refused with the
         error (an invalid grammar: the same refusal as when it was compiled inline)

Compiling may take seconds (JSON schemas of 800 to 1,000 optional properties took 1.6 to 8 s here); on
the loop it would stop every other request's tokens, message and timer for that long, and no step
would show it. One thread, so a worker never spends more than one core on compiles, and two requests with
the same new grammar compile it once (the second finds it cached). The compile itself runs in a child
process first (`runtime.grammar_child`), stopped after `timeout_s` (`WorkerConfig.grammar_compile_timeout_s`):
a grammar that takes longer is refused as its request's fault, and the compiles queued behind it wait at
most about twice that long for it (it compiles again here once it compiled there). At most `max_waiting`
compiles wait or run at once (`WorkerConfig.max_grammar_compiles_waiting`): past it `start` refuses at once
(`CompilesFull`), and the worker refuses the request as busy (503 with Retry-After): without a bound, a
client sending slow grammars could queue hours of compiles ahead of everyone's. The compiled grammar itself
travels with the message: the engine's cache may have let it go again by the time the loop takes the request.

Ownership: the worker (`runtime.request_table.RequestTable`) owns this object and its thread, and closes
it; each waiting request's state is its record's (the role's COMPILING phase), never kept here.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

from engine.structured_output import GrammarCompiler
from runtime.grammar_child import GrammarChild

logger = logging.getLogger("tandem.worker")


class CompilesFull(RuntimeError):
    """`max_waiting` compiles wait or run already: this one is not queued (the client may retry shortly)."""


@dataclass(frozen=True)
class GrammarCompiled:
    """For the loop: the grammar a waiting request asked for is compiled (`grammar`), or failed (`error`: a
    GrammarError for an invalid one, a ValueError; anything else a bug)."""

    request_id: str
    grammar: object = None  # xgrammar's CompiledGrammar
    error: BaseException | None = None


class GrammarCompiles:
    def __init__(self, grammars: GrammarCompiler, deliver: Callable[[object], None], name: str = "worker",
                 timeout_s: float = 30.0, max_waiting: int = 16):  # fmt: skip
        """`grammars`: the engine's; `deliver`: posts a message to the worker's loop (from any thread);
        `timeout_s`: the most one compile may take; `max_waiting`: the most compiles queued or running."""
        if max_waiting < 1:
            raise ValueError(f"max_waiting must be >= 1, got {max_waiting}")
        self.grammars, self._deliver, self.max_waiting = grammars, deliver, max_waiting
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"{name}-grammars")
        self._child = GrammarChild(grammars.tokenizer_info, timeout_s)
        self._waiting = 0  # started, not yet reported; counted on the loop thread, given back from the compile one
        self._lock = threading.Lock()

    @property
    def busy(self) -> bool:
        """A compile is queued or running (from `start` until its answer is delivered)."""
        return self._waiting > 0

    def cached(self, structured: tuple[str, str] | None):
        """`structured` compiled, if the engine's cache has it (instant); None when it has not, or no grammar
        is asked for. A request whose grammar is not cached waits for `start`."""
        return self.grammars.cached(structured) if structured is not None else None

    def start(self, request_id: str, structured: tuple[str, str]) -> None:
        """Compile on the compile thread; `GrammarCompiled(request_id, ...)` comes back through `deliver`.
        `CompilesFull` (nothing started, nothing will come back) when `max_waiting` compiles wait already."""
        with self._lock:
            if self._waiting >= self.max_waiting:
                raise CompilesFull(f"{self._waiting} structured-output grammars are compiling or waiting to compile on "
                                   "this worker; retry shortly")  # fmt: skip
            self._waiting += 1
        future = self._pool.submit(self._compiled, *structured)
        future.add_done_callback(lambda done: self._report(request_id, done))

    def _compiled(self, kind: str, spec: str):
        """On the compile thread: from the cache (an earlier request compiled it), else compiled in the child
        within the timeout first, then here (and cached)."""
        hit = self.grammars.cached((kind, spec))
        if hit is not None:
            return hit
        self._child.check(kind, spec)
        return self.grammars.compiled(kind, spec)

    def _report(self, request_id: str, done: Future) -> None:
        with self._lock:
            self._waiting -= 1
        if done.cancelled():  # closed before it ran: the worker is gone
            return
        error = done.exception()
        if error is not None and not isinstance(error, ValueError):
            logger.error("compiling the grammar of %s failed", request_id, exc_info=error)
        grammar = done.result() if error is None else None
        try:
            self._deliver(GrammarCompiled(request_id, grammar, error))
        except RuntimeError:  # the loop has stopped: nobody waits for this request any more
            pass

    def close(self) -> None:
        """Drop the compiles not yet started and kill the child: a compile under way fails at once, its answer
        unread (from this thread while the compile thread may wait on the child: killing it is what ends that)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._child.close()
