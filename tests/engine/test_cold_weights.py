"""Kernel timings read their weights from memory, as a decode step does (engine.layers.cold_weights): copies
of a layer past twice the last-level cache, each call on the next one."""

from __future__ import annotations

import torch

from engine.layers.cold_weights import FALLBACK_CACHE_BYTES, MAX_COPIES, copies_past_cache, form_bytes, \
    last_level_cache_bytes  # fmt: skip
from engine.layers.linear_choice import BANDS, Candidate, choose
from engine.quantized_weight import quantize


def _cache_level(root, index: int, level: int, size: str) -> None:
    folder = root / f"index{index}"
    folder.mkdir()
    (folder / "level").write_text(f"{level}\n")
    (folder / "size").write_text(f"{size}\n")


def test_the_last_level_cache_is_the_largest_level_sysfs_names(tmp_path):
    for index, (level, size) in enumerate([(1, "48K"), (1, "32K"), (2, "1024K"), (3, "32768K")]):
        _cache_level(tmp_path, index, level, size)
    assert last_level_cache_bytes(tmp_path) == 32 << 20
    _cache_level(tmp_path, 4, 4, "2M")
    assert last_level_cache_bytes(tmp_path) == 2 << 20  # the largest level, not the largest size
    assert last_level_cache_bytes(tmp_path / "absent") == FALLBACK_CACHE_BYTES


def test_copies_pass_twice_the_cache_within_the_cap():
    made = []

    def make():
        made.append(bytearray(30))
        return made[-1]

    assert len(copies_past_cache(make, len, cache_bytes=100)) == 7  # 7 x 30 bytes >= 2 x 100
    assert len(copies_past_cache(make, len, cache_bytes=10)) == 1
    assert len(copies_past_cache(make, len, cache_bytes=1 << 30)) == MAX_COPIES


def test_a_forms_bytes_count_its_tensors():
    weight = torch.zeros(64, 32)
    assert form_bytes(weight) == 64 * 32 * 4
    blocks = quantize(weight, "Q4_1")  # codes, float16 scales and offsets
    assert form_bytes(blocks) == 64 * 32 // 2 + 2 * 64 * (32 // 32) * 2


def test_each_timed_call_reads_the_next_copy_of_the_layer():
    seen = []

    def run(x, weight, bias):
        seen.append(weight.data_ptr())
        return 1.0

    # One layer of two [8, 4] float32 weights: 256 bytes; past twice 300 bytes: 3 copies.
    choose([Candidate("only", "dense", run)], [(8, 4), (8, 4)], torch.float32, {"dense": lambda w: w},
           timer=lambda call: sum(call()), cache_bytes=300)  # fmt: skip
    assert len(set(seen)) == 6  # 3 copies of 2 weights
    per_call = [tuple(seen[i:i + 2]) for i in range(0, len(seen), 2)]
    assert all(a != b for a, b in zip(per_call, per_call[1:]))  # never the copy the call before read
    assert len(per_call) == len(BANDS) * 6  # a warm call and 5 rounds per band
