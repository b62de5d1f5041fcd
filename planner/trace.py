"""Trace files: one request per line, in the shape of Mooncake's published traces.

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48]}

`timestamp` is milliseconds from the trace's start; `hash_ids` name the prompt's blocks of
`block_tokens` tokens (512 in Mooncake's traces): two requests that share a leading hash id share
those tokens, so the simulated prefix caches see the reuse the trace recorded. A line without
`hash_ids` gets a prompt of its own. Every mistake is a `ValueError` naming the line and the field.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from planner.workload import SimRequest

MOONCAKE_BLOCK_TOKENS = 512


def read_trace(path: str | Path, block_tokens: int = MOONCAKE_BLOCK_TOKENS, vocab_size: int = 32000,
               seed: int = 0) -> list[SimRequest]:  # fmt: skip
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as err:
        raise ValueError(f"cannot read trace {path}: {err.strerror}") from None
    blocks = _Blocks(block_tokens, vocab_size, seed)
    requests = [_request(line, f"{path}:{n}", blocks) for n, line in enumerate(lines, 1) if line.strip()]
    if not requests:
        raise ValueError(f"trace {path} has no request")
    start = min(r.arrival_s for r in requests)
    return sorted((SimRequest(r.arrival_s - start, r.prompt, r.output_len) for r in requests),
                  key=lambda r: r.arrival_s)  # fmt: skip


def _request(line: str, where: str, blocks: "_Blocks") -> SimRequest:
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
    return SimRequest(timestamp / 1000.0, blocks.prompt(hash_ids, input_length), output_length)


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
        self.fresh = np.random.default_rng([seed, 1 << 40])

    def prompt(self, hash_ids: list[int], length: int) -> tuple[int, ...]:
        tokens: list[int] = []
        for h in hash_ids:
            if len(tokens) >= length:
                break
            tokens += self._block(h)
        missing = length - len(tokens)
        if missing > 0:
            tokens += self.fresh.integers(self._low, self.vocab_size, missing).tolist()
        return tuple(tokens[:length])

    @property
    def _low(self) -> int:
        return min(100, self.vocab_size // 4)

    def _block(self, hash_id: int) -> list[int]:
        rng = np.random.default_rng([self.seed, abs(hash_id), hash_id < 0])
        return rng.integers(self._low, self.vocab_size, self.block_tokens).tolist()
