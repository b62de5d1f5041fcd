"""Trace files: one request per line, in the shape of Mooncake's published traces.

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48]}

`timestamp` is milliseconds from the trace's start; `hash_ids` name the prompt's blocks of
`block_tokens` tokens (512 in Mooncake's traces): two requests that share a leading hash id share
those tokens, so the simulated prefix caches see the reuse the trace recorded. A line without
`hash_ids` gets a prompt of its own. Every mistake is a `ValueError` naming the line and the field.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np

MOONCAKE_BLOCK_TOKENS = 512


class TraceRequest:
    """A trace's request: its prompt is made from its hash ids when asked for (a simulation asks at its arrival),
    so an hour of a trace need not hold every prompt at once."""

    __slots__ = ("arrival_s", "output_len", "_hash_ids", "_length", "_blocks")

    def __init__(self, arrival_s: float, hash_ids: tuple[int, ...], length: int, output_len: int, blocks: "_Blocks"):
        self.arrival_s, self.output_len = arrival_s, output_len
        self._hash_ids, self._length, self._blocks = hash_ids, length, blocks

    @property
    def prompt(self) -> tuple[int, ...]:
        return self._blocks.prompt(self._hash_ids, self._length)

    def shifted(self, start: float) -> "TraceRequest":
        return TraceRequest(self.arrival_s - start, self._hash_ids, self._length, self.output_len, self._blocks)


def read_trace(path: str | Path, block_tokens: int = MOONCAKE_BLOCK_TOKENS, vocab_size: int = 32000,
               seed: int = 0) -> list[TraceRequest]:  # fmt: skip
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as err:
        raise ValueError(f"cannot read trace {path}: {err.strerror}") from None
    blocks = _Blocks(block_tokens, vocab_size, seed)
    requests = [_request(line, f"{path}:{n}", blocks) for n, line in enumerate(lines, 1) if line.strip()]
    if not requests:
        raise ValueError(f"trace {path} has no request")
    start = min(r.arrival_s for r in requests)
    return sorted((r.shifted(start) for r in requests), key=lambda r: r.arrival_s)


def _request(line: str, where: str, blocks: "_Blocks") -> TraceRequest:
    try:
        entry = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: not a JSON object: {err}") from None
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: not a JSON object")
    timestamp = _number(entry, "timestamp", where, minimum=0)
    input_length = int(_number(entry, "input_length", where, minimum=1, whole=True))
    output_length = int(_number(entry, "output_length", where, minimum=1, whole=True))
    hash_ids = entry.get("hash_ids", [])
    if not isinstance(hash_ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in hash_ids):
        raise ValueError(f"{where}: hash_ids must be a list of integers")
    return TraceRequest(timestamp / 1000.0, tuple(hash_ids), input_length, output_length, blocks)


def _number(entry: dict, name: str, where: str, minimum: float, whole: bool = False) -> float:
    value = entry.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (whole and not isinstance(value, int)):
        raise ValueError(f"{where}: {name} must be {'a whole number' if whole else 'a number'}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{where}: {name} must be >= {minimum}, got {value}")
    return value


class _Blocks:
    """The tokens of each hash id (the same id, the same tokens), and fresh ones where a prompt runs past its ids."""

    def __init__(self, block_tokens: int, vocab_size: int, seed: int):
        if block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
        self.block_tokens, self.vocab_size, self.seed = block_tokens, vocab_size, seed
        self._block = functools.lru_cache(maxsize=4096)(self._make_block)  # shared prefixes come back often

    def prompt(self, hash_ids: tuple[int, ...], length: int) -> tuple[int, ...]:
        """The same hash ids give the same tokens; past its ids a prompt gets tokens no other prompt has (drawn
        from a generator seeded by its ids, so asking twice gives the same prompt)."""
        tokens: list[int] = []
        for h in hash_ids:
            if len(tokens) >= length:
                break
            tokens += self._block(h)
        missing = length - len(tokens)
        if missing > 0:
            rng = np.random.default_rng([self.seed, 1 << 40, length, *map(abs, hash_ids[:4])])
            tokens += rng.integers(self._low, self.vocab_size, missing).tolist()
        return tuple(tokens[:length])

    @property
    def _low(self) -> int:
        return min(100, self.vocab_size // 4)

    def _make_block(self, hash_id: int) -> list[int]:
        rng = np.random.default_rng([self.seed, abs(hash_id), hash_id < 0])
        return rng.integers(self._low, self.vocab_size, self.block_tokens).tolist()
