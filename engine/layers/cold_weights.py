"""Weights timed as a decode step reads them: from memory, not from the cache.

A decode step streams every layer's weights once, and a model's layers together outgrow any CPU cache, so
a linear kernel's speed at a few rows is its speed on weights that come from memory. Timed on one layer's
weights, read again and again, the weights sit in the cache and a kernel that spends compute to read fewer
bytes loses to one that reads more: on an AMD EPYC (AVX512-BF16, 32 MiB last-level cache, 1 thread) the
GGUF blocks' kernel lost rows 2-4 to oneDNN's bfloat16 GEMM warm (3 rows: 160 against 124 us for one
layer's four linears), and won them by 1.45x cold (187 against 272 us); served, a 2-row decode step took
16-20 ms on oneDNN where a 1-row one took 10 on the blocks.

So a timing cycles through copies of a layer's weights, each call on the next copy, enough of them that
their bytes pass twice the last-level cache: every call reads its weights from memory.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Callable, TypeVar

import torch

T = TypeVar("T")

FALLBACK_CACHE_BYTES = 32 << 20  # where the machine does not say (sysfs absent)
MAX_COPIES = 64  # a tiny model's layer needs thousands: its choice is not worth the memory or the time
# Part of a timed choice's cache key: choices timed on warm weights are timed again.
KEY = "weights: cycled past twice the last-level cache"


def last_level_cache_bytes(cpu_dir: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int:
    """The size of this CPU's largest cache level (sysfs: "32768K"), or FALLBACK_CACHE_BYTES."""
    sizes = {}
    for index in cpu_dir.glob("index*"):
        try:
            level, size = int((index / "level").read_text()), (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        if match := re.fullmatch(r"(\d+)([KMG]?)", size):
            sizes[level] = int(match[1]) << {"": 0, "K": 10, "M": 20, "G": 30}[match[2]]
    return sizes[max(sizes)] if sizes else FALLBACK_CACHE_BYTES


def form_bytes(form: object) -> int:
    """The bytes of a prepared weight: a tensor's, or the tensors' of a dataclass (packed, GGUF blocks)."""
    if isinstance(form, torch.Tensor):
        return form.numel() * form.element_size()
    if dataclasses.is_dataclass(form):
        return sum(form_bytes(getattr(form, f.name)) for f in dataclasses.fields(form))
    return 0


def copies_past_cache(make: Callable[[], T], bytes_of: Callable[[T], int], cache_bytes: int | None = None) -> list[T]:
    """`make()` called as many times as it takes the results' bytes past twice the last-level cache (one at
    least, MAX_COPIES at most)."""
    first = make()
    target = 2 * (cache_bytes or last_level_cache_bytes())
    count = min(MAX_COPIES, max(1, math.ceil(target / max(bytes_of(first), 1))))
    return [first, *(make() for _ in range(count - 1))]
