"""Which linear kernel runs each row count, chosen by timing them on the machine at hand.

What is fastest depends on the CPU: on an AVX-512 Xeon the native packed float32
kernel beat BLAS at every row count; on an AVX2-only EPYC it made prefill 2.4x
slower; on an AVX512-BF16 EPYC BLAS's bfloat16 GEMM beats the native few-rows
kernel that was tuned elsewhere. So the first time a worker starts on a machine
it times every candidate on the model's own linear shapes, for each band of row
counts (one row per sequence when decoding, up to a whole prefill chunk), with
the worker's torch threads, and keeps the fastest per band:

    candidates (by dtype)            the weight they read
    packed   native packed kernel    PackedWeight (float32 only)
    dense    F.linear (BLAS/oneDNN)  the [out, in] weight
    onednn   oneDNN, prepacked       oneDNN's blocked copy, made once (where this torch build has it)
    mv       torch.mv                the [out, in] weight (one row only)
    few      native few-rows kernel  the [out, in] weight (up to 16 rows)

The choice is cached (`~/.cache/tandem/kernel-choice/`, or $TANDEM_CACHE_DIR),
keyed by the CPU model and instruction set, the threads, the dtype, the shapes
and the native kernels' source version, and logged. A weight is kept in every
form some band's choice reads: one form when every band agrees, each of them
when they do not. On an AVX512-BF16 EPYC the prepacked oneDNN linear was
1.2-2.6x faster than F.linear, which lays the weight out anew on every call.
"""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from engine.layers.cold_weights import copies_past_cache, form_bytes
from engine.layers.kernel_timing import METHOD, Timer, fastest, sample_time

logger = logging.getLogger("tandem.engine")

Tensor = torch.Tensor

# (first row count, last row count, the row count timed for the band)
BANDS: tuple[tuple[int, int, int], ...] = ((1, 1, 1), (2, 4, 3), (5, 16, 10), (17, 64, 40), (65, 256, 160),
                                           (257, 1 << 30, 1024))  # fmt: skip


@dataclass(frozen=True)
class Candidate:
    name: str
    form: str  # which form of the weight it reads ("packed" or "dense")
    run: Callable[..., Tensor]  # (x, weight in that form, bias) -> x @ weight.T + bias
    max_rows: int = 1 << 30


def band_of(rows: int) -> int:
    """The index of the band `rows` falls in (0 rows: the last band's kernel copes with any)."""
    for i, (first, last, _) in enumerate(BANDS):
        if first <= rows <= last:
            return i
    return len(BANDS) - 1


def choose(candidates: Sequence[Candidate], shapes: Sequence[tuple[int, int]], dtype: torch.dtype,
           prepare: dict[str, Callable[[Tensor], object]], timer: Timer = sample_time,
           cache_bytes: int | None = None) -> tuple[str, ...]:  # fmt: skip
    """The fastest candidate's name per band on a layer of `shapes` ([out, in] each) whose weights are read
    from memory, as a decode step reads them (`cold_weights`: copies past twice `cache_bytes`, by default the
    last-level cache's); `prepare[form]` makes a form."""

    def layer(form: str) -> list:
        return [prepare[form](torch.randn(out, inp, dtype=torch.float32).to(dtype)) for out, inp in shapes]

    copies = {form: copies_past_cache(lambda form=form: layer(form), lambda ws: sum(map(form_bytes, ws)), cache_bytes)
              for form in {c.form for c in candidates}}  # fmt: skip
    choice = []
    for first, last, rows in BANDS:
        xs = [torch.randn(rows, inp, dtype=torch.float32).to(dtype) for _, inp in shapes]
        able = [c for c in candidates if c.max_rows >= last]  # it must take every row count of the band
        # (no shapes: nothing to time, every candidate's sum is 0 and the first one stays)
        choice.append(fastest({c.name: [_layer_call(c, xs, copies[c.form])] if shapes else [] for c in able}, timer))
    return tuple(choice)


def _layer_call(candidate: Candidate, xs: Sequence[Tensor], copies: Sequence[list]) -> Callable[[], list]:
    """One call: the layer's linears, each x on its weight, in the next copy of the layer (their outputs)."""
    turn = itertools.count()

    def call() -> list:
        weights = copies[next(turn) % len(copies)]
        return [candidate.run(x, w, None) for x, w in zip(xs, weights)]

    return call


def cached_choice(key_parts: Sequence[str], compute: Callable[[], tuple[str, ...]], what: str = "linear kernels",
                  describe_choice: Callable[[Sequence[str]], str] | None = None) -> tuple[str, ...]:  # fmt: skip
    """`compute()` once per machine and key (a name per band); later starts read the answer from the cache.

    Workers starting together on one machine time one after another (a file lock), not at once on
    shared cores: the first times, the others read its answer. How they time is part of the key."""
    key_parts = [*key_parts, f"timing: {METHOD}"]
    key = hashlib.blake2b("\n".join(key_parts).encode(), digest_size=10).hexdigest()
    path = _cache_dir() / f"{key}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path.with_suffix(".lock"), "w")
    except OSError as err:  # nowhere to cache (a read-only home): time now, again next start
        logger.warning("cannot cache the kernel choice at %s: %s", path.parent, err)
        return compute()
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _read(path) or _compute_and_write(path, key_parts, compute, what, describe_choice or describe)


def _read(path: Path) -> tuple[str, ...] | None:
    try:
        cached = json.loads(path.read_text())
        return tuple(cached["choice"]) if len(cached["choice"]) == len(BANDS) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _compute_and_write(path: Path, key_parts: Sequence[str], compute: Callable[[], tuple[str, ...]], what: str,
                       describe_choice: Callable[[Sequence[str]], str]) -> tuple:  # fmt: skip
    start = time.perf_counter()
    choice = compute()
    logger.info("%s timed on this machine in %.1fs: %s", what, time.perf_counter() - start, describe_choice(choice))
    try:
        path.write_text(json.dumps({"key": list(key_parts), "bands": [b[:2] for b in BANDS], "choice": choice}))
    except OSError as err:  # a read-only home: time again next start
        logger.warning("cannot cache the kernel choice at %s: %s", path, err)
    return choice


def describe(choice: Sequence[str], unit: str = "row") -> str:
    def rows(first: int, last: int) -> str:
        return f"1 {unit}" if last == 1 else f"{first}+ {unit}s" if last >= 1 << 30 else f"{first}-{last} {unit}s"

    return ", ".join(f"{rows(first, last)}: {name}" for (first, last, _), name in zip(BANDS, choice))


def _cache_dir() -> Path:
    root = os.environ.get("TANDEM_CACHE_DIR") or Path.home() / ".cache" / "tandem"
    return Path(root) / "kernel-choice"
