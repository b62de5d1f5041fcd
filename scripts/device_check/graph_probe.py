"""Would CUDA graphs lift the host's floor under a decode step? Capture the model's forward of one decode batch.

    python -m device_check.launch device_check.graph_probe --device cuda --model-dir DIR [--rows 1,64]

For each batch size: the eager forward's time, then one CUDA graph of the same forward (same inputs, same
addresses) captured and replayed; a capture that fails says which operation is not graph-safe (a sync
with the host inside the forward, an allocation it cannot replay). An experiment: the engine does not
use graphs yet; this says what they would buy and whether the forward still allows them. On the lent
H200 (2026-11-26) it did: eager 24-31 ms, replayed 2.0-2.4 ms (1 and 64 rows). A dry run times the
eager forward on the CPU and says that graphs need CUDA.
"""

from __future__ import annotations

import argparse
import time

import torch

from .step_io import figure
from .step_trace import decoding_engine, sync

REPS = 20


def _timed_ms(fn, device: str) -> float:
    sync(device)
    start = time.perf_counter()
    for _ in range(REPS):
        fn()
    sync(device)
    return (time.perf_counter() - start) / REPS * 1e3


def probe(model_dir: str, device: str, rows: int) -> None:
    engine = decoding_engine(model_dir, device, "float32" if device == "cpu" else "bfloat16", rows)
    try:
        sched = engine.scheduler.schedule()
        batch = engine.runner.prepare(sched.scheduled)
        runner = engine.runner
        eager = _timed_ms(lambda: runner.forward(batch), device)
        figure(f"decode {rows} rows, eager forward", f"{eager:.2f} ms")
        if not device.startswith("cuda"):
            figure(f"decode {rows} rows, graph", "not captured: CUDA graphs need a GPU")
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                runner.forward(batch)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                runner.forward(batch)
        except Exception as err:  # noqa: BLE001  (what breaks the capture is the finding)
            figure(f"decode {rows} rows, graph", f"capture failed: {type(err).__name__}: {str(err)[:300]}")
            return
        replay = _timed_ms(graph.replay, device)
        figure(f"decode {rows} rows, graph", f"replay {replay:.2f} ms ({eager / replay:.1f}x the eager forward)")
    finally:
        engine.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--rows", default="1,64")
    args = parser.parse_args()
    for rows in (int(r) for r in args.rows.split(",")):
        try:
            probe(args.model_dir, args.device, rows)
        except Exception as err:  # noqa: BLE001
            figure(f"decode {rows} rows", f"probe failed: {type(err).__name__}: {str(err)[:300]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
