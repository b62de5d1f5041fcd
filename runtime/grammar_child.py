"""A worker's structured-output grammars compiled in a child process, so that one compile can be stopped.

    child = GrammarChild(engine.grammars.tokenizer_info, timeout_s=30.0)
    child.check("json", schema)   # returns once it compiled there; GrammarError if it is invalid,
                                  # GrammarTimeout if it took longer than timeout_s (the child is killed)
    compiled = engine.grammars.compiled("json", schema)   # then here, in about the time it took there
    child.close()

xgrammar compiles in C++ and cannot be interrupted: on a thread, a grammar that takes minutes (a schema of
thousands of alternatives fits in the router's 64K characters) holds that thread, and every grammar queued
behind it, for as long. In a process it is killed at `timeout_s`, its request refused as the grammar's
fault, and the next compile starts a fresh child. A grammar that crashes xgrammar (a bug of its C++) takes
the child down, not the worker.

The child (`python -m runtime.grammar_child`) is started on the first compile (importing torch and xgrammar
takes seconds, and most workers never see a grammar), told the vocabulary once (`TokenizerInfo` as JSON),
and then compiles one (kind, spec) at a time and says whether it could. Only a grammar that compiled there
in time is compiled again in the worker: xgrammar's serialization of a compiled grammar costs far more than
compiling it (a schema of 900 two-typed properties, tiny vocabulary: compiled in 7.9 s, serialized in 52 s
to 654 MB of JSON, read back in 15 s), so twice the compile is the cheap way to a bound. Messages on its
stdin and stdout are msgpack, each after its length (4 bytes, big-endian); whatever the child prints goes
to its stderr.

Ownership: one per worker, owned by its `runtime.grammar_compiles.GrammarCompiles` and used from its one
compile thread only (not thread-safe); `close` kills the child.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from typing import BinaryIO, Callable

import msgpack

from engine.structured_output import GrammarError

START_TIMEOUT_S = 120.0  # importing torch and xgrammar, building the vocabulary: seconds, minutes when swapping
_LENGTH_BYTES = 4


class GrammarTimeout(GrammarError):
    """A grammar that did not compile in the time a worker allows one (the request's fault, like an invalid one)."""


class _ChildGone(RuntimeError):
    """The child closed its end (it crashed or was killed)."""


class GrammarChild:
    def __init__(self, tokenizer_info: Callable[[], object], timeout_s: float):
        """`tokenizer_info`: the engine's xgrammar TokenizerInfo (asked for on the first compile);
        `timeout_s`: the most one compile may take (the child's start is not counted)."""
        if not timeout_s > 0:
            raise ValueError(f"a grammar compile timeout must be > 0 s, got {timeout_s}")
        self._tokenizer_info, self.timeout_s = tokenizer_info, timeout_s
        self._proc: subprocess.Popen | None = None

    def check(self, kind: str, spec: str) -> None:
        """Returns once (kind, spec) compiled in the child; GrammarError when it is invalid, GrammarTimeout when
        it takes longer than `timeout_s` (the child is killed), GrammarError when it crashes the compiler."""
        proc = self._started()
        try:
            _write(proc.stdin, [kind, spec])
            status, text = _read(proc.stdout, time.monotonic() + self.timeout_s)
        except TimeoutError:
            self._stop()
            raise GrammarTimeout(f"the {kind} grammar for structured output did not compile within "
                                 f"{self.timeout_s:g} s; simplify it") from None  # fmt: skip
        except (_ChildGone, BrokenPipeError):
            self._stop()
            raise GrammarError(f"the {kind} grammar for structured output crashed its compiler") from None
        if status == "invalid":
            raise GrammarError(text)
        if status != "ok":
            raise RuntimeError(f"the grammar compiler process failed: {text}")

    @property
    def pid(self) -> int | None:
        """The child's process id; None while none runs (before the first compile, after a kill)."""
        return self._proc.pid if self._proc is not None else None

    def close(self) -> None:
        self._stop()

    def _started(self) -> subprocess.Popen:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # this process's imports
        proc = subprocess.Popen([sys.executable, "-m", "runtime.grammar_child"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, env=env)  # fmt: skip
        self._proc = proc
        try:
            _write(proc.stdin, self._tokenizer_info().serialize_json())
            _read(proc.stdout, time.monotonic() + START_TIMEOUT_S)  # "ready"
        except (TimeoutError, _ChildGone, BrokenPipeError) as err:
            self._stop()
            raise RuntimeError(f"the grammar compiler process did not start: {type(err).__name__}") from err
        return proc

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.kill()
            proc.wait()
            proc.stdin.close()
            proc.stdout.close()


def _write(stream: BinaryIO, msg) -> None:
    data = msgpack.packb(msg, use_bin_type=True)
    stream.write(len(data).to_bytes(_LENGTH_BYTES, "big") + data)
    stream.flush()


def _read(stream: BinaryIO, deadline: float):
    """The next message, or TimeoutError at `deadline` (None: no deadline), _ChildGone at the stream's end."""
    size = int.from_bytes(_read_exactly(stream, _LENGTH_BYTES, deadline), "big")
    return msgpack.unpackb(_read_exactly(stream, size, deadline), raw=False)


def _read_exactly(stream: BinaryIO, n: int, deadline: float | None) -> bytes:
    data = bytearray()
    fd = stream.fileno()
    while len(data) < n:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(n - len(data), 1 << 20))
        if not chunk:
            raise _ChildGone
        data += chunk
    return bytes(data)


def _serve() -> None:
    """The child: the vocabulary first, then one grammar at a time until its stdin closes."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed goes to stderr, never into the replies
    import xgrammar as xgr

    from engine.structured_output import grammar_of

    requests = sys.stdin.buffer
    info = xgr.TokenizerInfo.deserialize_json(_read(requests, None))
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    _write(out, "ready")
    while True:
        try:
            kind, spec = _read(requests, None)
        except _ChildGone:
            return
        try:
            compiler.compile_grammar(grammar_of(kind, spec))
            _write(out, ["ok", ""])
        except GrammarError as err:
            _write(out, ["invalid", str(err)])
        except Exception as err:  # xgrammar's own failure: the worker refuses the request and says so
            _write(out, ["error", f"{type(err).__name__}: {err}"])


if __name__ == "__main__":
    _serve()
