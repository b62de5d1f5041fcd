"""The machine's pace now: two fixed pieces of work timed on a worker's threads, so that a benchmark can tell
whether the machine itself changed speed between a calibration and the runs priced by it.

    pace = machine_pace(threads=2)     # Pace(decode_ms=..., prefill_ms=...): each the median of its repeats
    pace.drift(reference)              # the larger relative change of the two, signed (+0.15: 15% slower)

This VM's speed moves by 10-40% within an hour, and a neighbour can take half of it for minutes: a run
measured then prices the machine, not the model. The two pieces are the two kinds of step a worker runs:
a decode-like product (8 rows through a 4,096 x 4,096 fp32 matrix, 64 MB: memory-bound) and a prefill-like
one (256 rows through a 576 x 4,608 one: compute-bound), on the worker's thread count. About 3 s in all;
on the Intel Xeon VM of 2026-11-27 the pace repeated within about 5% from one call to the next.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

REPEATS = 9  # medians of this many timings: one preempted timing moves nothing
CALLS = {"decode": 16, "prefill": 16}  # products per timing (~100-200 ms each on 2 cores)


@dataclass(frozen=True)
class Pace:
    decode_ms: float  # one decode-like product, median
    prefill_ms: float  # one prefill-like product, median

    def drift(self, reference: "Pace") -> float:
        """The larger (by size) of the two relative changes from `reference`: +0.2 is 20% slower now."""
        changes = (self.decode_ms / reference.decode_ms - 1, self.prefill_ms / reference.prefill_ms - 1)
        return max(changes, key=abs)

    def as_dict(self) -> dict:
        return {"decode_ms": self.decode_ms, "prefill_ms": self.prefill_ms}


def machine_pace(threads: int) -> Pace:
    """Time both pieces on `threads` torch threads (the caller's setting is put back)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(0)
        # Decode: 64 MB of weights, past any last-level cache, as a model's layers are; prefill: an MLP's.
        big, small = torch.randn(4096, 4096, generator=gen), torch.randn(576, 4608, generator=gen)
        decode = _median_ms(torch.randn(8, 4096, generator=gen), big, CALLS["decode"])
        return Pace(decode, _median_ms(torch.randn(256, 576, generator=gen), small, CALLS["prefill"]))
    finally:
        torch.set_num_threads(before)


def _median_ms(x, weight, calls: int) -> float:
    import torch

    for _ in range(calls):  # warm: the first calls allocate and fault pages in
        torch.matmul(x, weight)
    timings = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        for _ in range(calls):
            torch.matmul(x, weight)
        timings.append((time.perf_counter() - started) / calls * 1000)
    return statistics.median(timings)


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--times", type=int, default=5)
    a = p.parse_args()
    for _ in range(a.times):
        print(machine_pace(a.threads))
