"""A served worker's engine steps, one JSON line each: what the performance model needs to compare serving with
its profile (`tandem profile` times steps alone; here they share the host with the router, Ray and clients).

    TANDEM_STEP_TRACE=DIR tandem serve ...

Each worker's loop appends to DIR/<worker name>-<pid>.jsonl, one line a step:

    {"t": monotonic start (s), "s": the step's seconds (`LLMEngine.step` whole, as the loop pays it),
     "tokens": ..., "sequences": ..., ...,   the step's `costmodel.StepShape`
     "prompt_tokens": ...,                    its prefill chunks' tokens (the rest are decode rows)
     "chunks": [[new, context], ...]}         each prefill chunk (`runtime.step_shapes.prefill_chunks`)

A step that scheduled nothing (no free block) has no line. Unset (the default), nothing is wrapped or timed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from pathlib import Path
from typing import Callable, TypeVar

from engine.llm_engine import LLMEngine
from runtime.step_shapes import RecordingRunner

ENV = "TANDEM_STEP_TRACE"
T = TypeVar("T")


class StepTrace:
    """Owns the file it appends to and the recording runner it puts in place of `engine.runner`."""

    def __init__(self, engine: LLMEngine, path: Path):
        self.runner = RecordingRunner(engine.runner)
        engine.runner = self.runner
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a", buffering=1)  # a line is on disk when written: a killed worker keeps its steps

    def step(self, run: Callable[[], T]) -> T:
        """`run()` (one engine step), timed; its line is written even when it raises."""
        start = time.monotonic()  # the clock a calibration's client windows its phases by
        try:
            return run()
        finally:
            seconds = time.monotonic() - start
            shape, self.runner.last_shape = self.runner.last_shape, None
            if shape is not None:
                line = {"t": round(start, 6), "s": round(seconds, 6), **dataclasses.asdict(shape),
                        "prompt_tokens": self.runner.last_prompt_tokens, "chunks": self.runner.last_chunks}  # fmt: skip
                self._file.write(json.dumps(line) + "\n")

    def close(self) -> None:
        """The worker is closing (`runtime.request_table.RequestTable.close_shared`): no step follows."""
        self._file.close()


def step_trace_from_env(engine: LLMEngine, worker_name: str) -> StepTrace | None:
    """The trace `TANDEM_STEP_TRACE` asks for, of this worker's engine; None when unset."""
    folder = os.environ.get(ENV, "").strip()
    if not folder:
        return None
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", worker_name)
    return StepTrace(engine, Path(folder) / f"{safe}-{os.getpid()}.jsonl")


def read_step_trace(path: Path) -> list[dict]:
    """The lines of one trace file, oldest step first."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
