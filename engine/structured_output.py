"""Structured outputs: a request's output must match a JSON schema, any JSON value, a regex, one of a list of
strings, or an EBNF grammar. xgrammar (the grammar engine vLLM and SGLang use) turns the grammar into a
mask of the tokens allowed next; the sampler applies the masks of a whole batch at once.

A request asks with `SamplingParams.structured = (kind, spec)`:

    kind           spec (text)
    "json"         a JSON schema, as JSON
    "json_object"  "" (any JSON object, as OpenAI's `json_object`)
    "regex"        a regular expression
    "choice"       a JSON list of strings
    "grammar"      an EBNF grammar (xgrammar's dialect, GBNF-like, with a `root` rule)

JSON under a schema is generated compact, with `json.dumps`'s separators (", " and ": ") and no other
whitespace: a model that may emit whitespace anywhere can loop on it until max_tokens.

Ownership: the engine holds one `GrammarCompiler` (the tokenizer's vocabulary, and compiled grammars in a
`CompiledGrammars` cache bounded by their bytes); each request's `SamplingState` owns its `GrammarState`.
Compiling a grammar may take seconds (a schema of many optional properties): a serving worker compiles
on a thread of its own, in a child process it can stop (`runtime.grammar_compiles`), and hands the engine
the compiled grammar, so its loop thread only ever looks the cache up; the offline `LLM` compiles when it
adds the request.

The matcher follows the request's output tokens wherever they came from: before each mask it accepts the
tokens it has not seen, so a request whose first token was sampled on a prefill worker, or that resumes on
another worker with tokens already produced, rebuilds its place in the grammar from those tokens.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from typing import Callable, Sequence

import torch

from engine.sampling_params import STRUCTURED_KINDS

logger = logging.getLogger("tandem.engine")

JSON_SEPARATORS = (", ", ": ")
# What one engine's compiled grammars may hold, in xgrammar's own measure (`memory_size_bytes`). A grammar is
# client input: a count alone bounds nothing (big schemas and choice lists measured 4 to 40 MB compiled, with
# a 384-token vocabulary; more with a real one). 256 MiB keeps thousands of ordinary grammars (a few to tens
# of KB each) while a flood of big ones costs at most this much.
DEFAULT_GRAMMAR_CACHE_BYTES = 256 * 2**20


class GrammarError(ValueError):
    """A structured-output spec that cannot be compiled (an invalid schema, regex or grammar)."""


def grammar_of(kind: str, spec: str):
    """The xgrammar Grammar a (kind, spec) asks for; raises GrammarError naming what is wrong."""
    import xgrammar as xgr

    try:
        if kind == "json":
            return xgr.Grammar.from_json_schema(spec, any_whitespace=False, separators=JSON_SEPARATORS)
        if kind == "json_object":  # any object, as OpenAI's json_object
            return xgr.Grammar.from_json_schema('{"type": "object"}', any_whitespace=False, separators=JSON_SEPARATORS)
        if kind == "regex":
            return xgr.Grammar.from_regex(spec)
        if kind == "choice":
            return xgr.Grammar.from_ebnf("root ::= " + " | ".join(_ebnf_literal(c) for c in _choices(spec)))
        if kind == "grammar":
            return xgr.Grammar.from_ebnf(spec)
    except GrammarError:
        raise
    except Exception as err:  # xgrammar raises RuntimeError with its parser's position in the message
        raise GrammarError(f"invalid {kind} for structured output: {_reason(err)}") from err
    raise GrammarError(f"unknown structured output kind {kind!r}; use one of {', '.join(STRUCTURED_KINDS)}")


def _choices(spec: str) -> list[str]:
    try:
        choices = json.loads(spec)
    except ValueError:
        choices = None
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
        raise GrammarError("choice must be a non-empty list of non-empty strings")
    return choices


def _ebnf_literal(text: str) -> str:
    # A JSON string literal is a valid EBNF one: the same quotes and the same escapes (\" \\ \n \uXXXX).
    return json.dumps(text, ensure_ascii=True)


def _reason(err: Exception) -> str:
    # "[10:55:29] /project/cpp/regex_converter.cc:83: Regex parsing error at position 4" -> what follows the path
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return text.split(": ", 1)[1] if text.startswith("[") and ": " in text else text


class CompiledGrammars:
    """Compiled grammars by (kind, spec), least recently used first out once their bytes pass `limit_bytes`.
    A grammar bigger than the whole bound is not kept (keeping it would evict every other one).

    Owned by the engine's `GrammarCompiler`; thread-safe: a worker's compile thread adds, its loop thread
    looks up."""

    def __init__(self, limit_bytes: int):
        self.limit_bytes = limit_bytes
        self.bytes = 0
        self._entries: OrderedDict[tuple[str, str], tuple[object, int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: tuple[str, str]):
        """The compiled grammar (now the most recently used), or None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key: tuple[str, str], compiled) -> None:
        size = compiled.memory_size_bytes
        with self._lock:
            if key in self._entries or size > self.limit_bytes:
                return
            self._entries[key] = (compiled, size)
            self.bytes += size
            while self.bytes > self.limit_bytes:
                _, (_, evicted) = self._entries.popitem(last=False)
                self.bytes -= evicted


class GrammarCompiler:
    """One engine's grammars: the vocabulary is read from the tokenizer on the first compile (the engine may
    run without one until then: `load_tokenizer` is called once), compiled grammars are cached by (kind,
    spec) up to `cache_bytes`. `compiled` may run on any thread (a worker's compile thread); `cached` and
    `state_for` with a grammar given never compile."""

    def __init__(self, load_tokenizer: Callable[[], object], vocab_size: int, stop_token_ids: Sequence[int],
                 cache_bytes: int = DEFAULT_GRAMMAR_CACHE_BYTES):  # fmt: skip
        self._load_tokenizer = load_tokenizer
        self.vocab_size = vocab_size
        self._stop_token_ids = list(stop_token_ids)
        self.cache = CompiledGrammars(cache_bytes)
        self._info = self._xgr_compiler = None
        self._lock = threading.Lock()  # the vocabulary and compiler are built once, by whichever thread asks first

    def tokenizer_info(self):
        """xgrammar's view of the vocabulary (built once, by whichever thread asks first)."""
        import xgrammar as xgr

        with self._lock:
            if self._info is None:
                self._info = xgr.TokenizerInfo.from_huggingface(self._load_tokenizer(), vocab_size=self.vocab_size,
                                                                stop_token_ids=self._stop_token_ids or None)  # fmt: skip
            return self._info

    def _compiler(self):
        import xgrammar as xgr

        info = self.tokenizer_info()
        with self._lock:
            if self._xgr_compiler is None:
                # xgrammar's own cache is off: it has no bound by default, and `cache` is the one that counts.
                self._xgr_compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
            return self._xgr_compiler

    def cached(self, structured: tuple[str, str]):
        """The compiled grammar if it is in the cache (instant), else None."""
        return self.cache.get(tuple(structured))

    def compiled(self, kind: str, spec: str):
        """The compiled grammar, from the cache or compiled now (seconds, for some); GrammarError if invalid."""
        hit = self.cache.get((kind, spec))
        if hit is not None:
            return hit
        compiled = self._compiler().compile_grammar(grammar_of(kind, spec))
        self.cache.put((kind, spec), compiled)
        return compiled

    def state_for(self, structured: tuple[str, str], resumed: Sequence[int] = (), compiled=None) -> GrammarState:
        """A matcher after `resumed` (output an earlier attempt produced, now ending the prompt); it catches
        up on the request's own output tokens when it masks. `compiled`: the grammar of `structured` when the
        caller has it (None: from the cache or compiled now). GrammarError if the grammar refuses `resumed`."""
        import xgrammar as xgr

        compiled = compiled if compiled is not None else self.compiled(*structured)
        matcher = xgr.GrammarMatcher(compiled)
        for token in resumed:
            if not matcher.accept_token(token):
                raise GrammarError(f"the resumed output does not match the {structured[0]} grammar at token {token}")
        return GrammarState(matcher, compiled)


class GrammarState:
    """Where one request's output stands in its grammar. Owned by the request's `SamplingState`."""

    def __init__(self, matcher, compiled=None):
        self.matcher = matcher
        self.compiled = compiled  # its grammar, compiled: a request queued again (decode's recompute) reuses it
        self.accepted = 0  # output tokens the matcher has consumed
        self.broken = False  # a token the grammar does not allow arrived: no more masks

    def catch_up(self, output_token_ids: Sequence[int]) -> None:
        for token in output_token_ids[self.accepted :]:
            if not self.broken and not self.matcher.accept_token(token):
                # Only a token produced without this grammar's mask can get here (a bug, or a worker that
                # was not told): say so and leave the request unconstrained rather than fail its batch.
                logger.error("structured output: token %d is not allowed by the grammar; unconstrained from here",
                             token)  # fmt: skip
                self.broken = True
        self.accepted = len(output_token_ids)


def apply_grammars(x: torch.Tensor, grammars: Sequence[tuple[int, GrammarState, Sequence[int]]]) -> None:
    """In place on x [rows, vocab]: tokens each row's grammar does not allow next get -inf.

    grammars: (row, its GrammarState, the row's output tokens so far)."""
    import xgrammar as xgr

    rows = []
    bitmask = xgr.allocate_token_bitmask(x.shape[0], x.shape[1])  # [rows, ceil(vocab / 32)] int32, all allowed
    for row, state, output_token_ids in grammars:
        state.catch_up(output_token_ids)
        if not state.broken:
            state.matcher.fill_next_token_bitmask(bitmask, row)
            rows.append(row)
    if rows:
        xgr.apply_token_bitmask_inplace(x, bitmask, indices=rows)
