"""A CPU engine's host memory: freed activations are reused, not faulted in again (engine.cpu_memory)."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.cpu_memory import huge_pages

SCRIPT = """
import random, resource, sys, torch
import engine.model_runner
if sys.argv[1] == "default":  # glibc's own behaviour (bimodal: see the test)
    engine.model_runner.keep_freed_memory = lambda: False
from engine import LLM, SamplingParams
torch.set_num_threads(2)
eng = LLM(model=None, max_model_len=2048, enable_prefix_caching=False).engine  # the default model
def step(seed):  # one prefill step of 16 prompts of 128 tokens
    rng = random.Random(seed)
    for i in range(16):
        eng.add_request(f"{seed}-{i}", [rng.randrange(100, 40000) for _ in range(128)],
                        SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    while eng.has_unfinished_requests():
        eng.step()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
step(0)  # the first allocates what the next reuse (or not)
print(sum(step(seed) for seed in range(1, 3)))
"""


def _faults_per_step(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True).stdout
    return int(out.split()[-1])


def test_an_engines_steps_reuse_their_activations_pages_instead_of_faulting_in_new_ones():
    # glibc alone is bimodal here: 0-1,536 faults over 3 such steps in some processes, 120k-150k in others
    # (its adaptive mmap threshold: 20k-57k a step); kept, the pages are always reused.
    kept = _faults_per_step("kept")
    assert kept < 20_000, kept  # 0-3,300 seen (what else the process allocates meanwhile)


def test_a_buffer_asked_for_huge_pages_faults_in_a_few_of_them_not_thousands_of_small_ones():
    buffer = np.zeros(64 << 20, dtype=np.uint8)  # calloc: fresh pages, mapped on first write
    assert huge_pages(buffer.ctypes.data, buffer.nbytes)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    buffer[::4096] = 1
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    if "[never]" in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text():
        pytest.skip(f"transparent huge pages are off on this machine ({faults} small faults)")
    # 16,384 pages of 4 KiB would be 16,384 faults; huge ones cover all but the unaligned ends
    assert faults < 16384 // 8, faults
