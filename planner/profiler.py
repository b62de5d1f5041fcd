"""`tandem profile`: time real engine steps on the machine at hand and fit the step cost model to them.

The engine is the one a worker runs (same model, dtype, threads, kernels chosen at its start); each
step is timed whole (`LLMEngine.step`: schedule, forward, sampling, bookkeeping), as a worker's loop
pays it. The grid covers what serving mixes:

  - prefill chunks of each length in `prefill_lengths`, from an empty cache;
  - chunks of `cached_news` tokens after `cached_contexts` tokens served by the prefix cache;
  - decode batches of `decode_rows` rows at each context of `decode_contexts`, `decode_steps` steps each,
    the rows on both sides of every edge of the engine's kernel bands up to 65 (`KERNEL_BAND_FIRSTS`: the
    linear layers' kernel can change there, and the fit prices each band apart);
    every row has a context of its own, as in serving (rows sharing a cached prefix read the same blocks,
    which the CPU's caches then serve: their steps ran up to a third faster than distinct rows'), so a
    batch is only built where its prompts total at most `max_decode_batch_tokens`;
  - mixed steps: decode batches of `mixed_rows` joined by a prompt of each of `mixed_prompts` tokens.

Every step the grid makes, the setup ones too, is a sample; the fit (`planner.fit`) uses them all.

The grid's cases run in one shuffled order: this VM's speed drifts by 10-40% within an hour, and a grid run
kind by kind let a slow minute bias a whole group (one-row decode steps at one context timed 17-30 ms),
which the fit took for a term; spread over the run, the drift is noise the fit averages. `rounds` > 1 runs
each cached, decode and mixed case that many times, a decode case taking its share of `decode_steps` each
time: more spread, but every decode batch is prefilled again (2 rounds: 6.4 minutes of steps on one thread
of the 2-core EPYC, against 3.6 for 1), so the default is 1.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from functools import partial
from typing import Callable, Sequence

from engine.layers.linear_choice import BANDS
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from planner.fit import StepSample
from runtime.step_shapes import RecordingRunner

KERNEL_BAND_FIRSTS = tuple(first for first, _, _ in BANDS)  # the fit's bands (`planner.fit`)


@dataclass(frozen=True)
class ProfileGrid:
    prefill_lengths: tuple[int, ...] = (16, 64, 256, 512, 1024, 2048)
    prefill_reps: int = 3
    cached_contexts: tuple[int, ...] = (512, 1536)
    cached_news: tuple[int, ...] = (32, 256)
    decode_rows: tuple[int, ...] = (1, 2, 4, 5, 8, 16, 17, 32, 64, 65, 128)
    decode_contexts: tuple[int, ...] = (64, 640, 1664)
    decode_steps: int = 16
    max_decode_batch_tokens: int = 40_000
    mixed_rows: tuple[int, ...] = (4, 32)
    mixed_prompts: tuple[int, ...] = (128, 1024)
    rounds: int = 1

    @classmethod
    def tiny(cls) -> "ProfileGrid":
        """A grid for tiny test models: every kind of step, seconds in all."""
        return cls((8, 32, 96), 1, (32,), (16,), (1, 4, 8), (16, 48), 4, 400, (2,), (24,), rounds=2)


class StepProfiler:
    """Drives an engine through a `ProfileGrid`, keeping one `StepSample` per step."""

    def __init__(self, engine: LLMEngine, seed: int = 0, on_progress: Callable[[str], None] = lambda what: None):
        self.engine, self.rng, self.on_progress = engine, random.Random(seed), on_progress
        self.runner = RecordingRunner(engine.runner)
        self.samples: list[StepSample] = []
        self._ids = 0
        vocab = engine.config.model.vocab_size
        self._token_range = (min(100, vocab // 4), vocab - 1)  # ordinary tokens, away from the special ones

    def run(self, grid: ProfileGrid, warm_pass: bool = False) -> list[StepSample]:
        """The grid's steps; with `warm_pass`, the whole grid once unrecorded first (on a GPU, Triton compiles
        a kernel for each new specialization of its arguments: on an H200 a step of a new shape took
        570-730 ms, the same step warm 19 ms, and the fit chased them)."""
        self.engine.runner = self.runner
        try:
            self._warm(grid)
            for _ in range(2 if warm_pass else 1):
                self.samples.clear()
                for case in self._cases(grid):
                    case()
        finally:
            self.engine.runner = self.runner.inner
        return self.samples

    # ---- the grid ---------------------------------------------------------------
    def _warm(self, grid: ProfileGrid) -> None:
        """A batch of each size once, unrecorded: a shape's first steps in a process pay one-time costs (oneDNN
        builds its primitives for each new row count: a one-row step timed 45-52 ms, then 22 ms, with one
        thread), which a serving worker pays once at its start, not in its steady state."""
        self.on_progress("warming up every batch size")
        for rows in grid.decode_rows:
            if self._fits(rows, 32):
                self._generate([self._tokens(16) for _ in range(rows)], 3)
        self.samples.clear()

    def _cases(self, grid: ProfileGrid) -> list[Callable[[], None]]:
        """Every case of the grid in one shuffled order (the module's docstring says why)."""
        prefills, steps = self._fitting(grid.prefill_lengths), math.ceil(grid.decode_steps / grid.rounds)
        cases = [partial(self._prefill, n) for n in prefills for _ in range(grid.prefill_reps)]
        for _ in range(grid.rounds):
            cases += [partial(self._cached_prefill, c, grid.cached_news) for c in self._fitting(grid.cached_contexts)]
            cases += [partial(self._decode, rows, context, steps) for context, rows in self._decode_batches(grid)]
            mixed_prompts = self._fitting(grid.mixed_prompts)
            cases += [partial(self._mixed, rows, n) for rows in grid.mixed_rows for n in mixed_prompts]
        self.rng.shuffle(cases)
        return cases

    def _prefill(self, length: int) -> None:
        self.on_progress(f"prefill {length} tokens")
        self._generate([self._tokens(length)], 1)

    def _cached_prefill(self, context: int, news: Sequence[int]) -> None:
        """A prompt of `context` tokens, then each of `news` tokens more after it (served by the prefix cache)."""
        base = self._tokens(context)
        self._generate([base], 1)
        for new in self._fitting(news, context):
            self.on_progress(f"prefill {new} tokens after {context} cached")
            self._generate([base + self._tokens(new)], 1)

    def _decode_batches(self, grid: ProfileGrid) -> list[tuple[int, int]]:
        """(context, rows) of each decode batch that fits the grid's bound and the engine."""
        return [(context, rows) for context in self._fitting(grid.decode_contexts, grid.decode_steps)
                for rows in grid.decode_rows
                if rows * context <= grid.max_decode_batch_tokens and self._fits(rows, context + grid.decode_steps)]  # fmt: skip

    def _decode(self, rows: int, context: int, steps: int) -> None:
        """Rows prefilled first (those done early decode beside the later chunks: mixed steps, kept too), then
        `steps` steps of the whole batch, then the batch is dropped."""
        self.on_progress(f"decode {rows} rows at context {context}")
        room = self.engine.max_model_len - context - 1
        ids = self._add([self._tokens(context) for _ in range(rows)], room)
        self._step_until(lambda: all(self.engine.requests[i].output_token_ids for i in ids))
        for _ in range(steps):
            self._step()
        for request_id in ids:
            self.engine.abort_request(request_id)

    def _mixed(self, rows: int, prompt: int) -> None:
        self.on_progress(f"{rows} decode rows with a {prompt}-token prompt")
        self._add([self._tokens(64) for _ in range(rows)], 8)
        self._step_until(lambda: all(r.output_token_ids for r in self.engine.requests.values()))
        self._add([self._tokens(prompt)], 1)
        self._step_until(lambda: not self.engine.has_unfinished_requests())

    # ---- driving the engine ----------------------------------------------------------
    def _generate(self, prompts: list[list[int]], max_tokens: int) -> None:
        self._add(prompts, max_tokens)
        self._step_until(lambda: not self.engine.has_unfinished_requests())

    def _add(self, prompts: list[list[int]], max_tokens: int) -> list[str]:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        ids = []
        for prompt in prompts:
            self._ids += 1
            ids.append(f"profile-{self._ids}")
            self.engine.add_request(ids[-1], {"prompt_token_ids": prompt}, params)
        return ids

    def _step_until(self, done: Callable[[], bool]) -> None:
        while not done():
            self._step()

    def _step(self) -> None:
        start = time.perf_counter()
        self.engine.step()
        seconds = time.perf_counter() - start
        if self.runner.last_shape is not None:
            self.samples.append(StepSample(self.runner.last_shape, seconds, self.runner.last_chunks))
            self.runner.last_shape = None

    def _tokens(self, n: int) -> list[int]:
        low, high = self._token_range
        return [self.rng.randint(low, high) for _ in range(n)]

    def _fitting(self, lengths: Sequence[int], extra: int = 0) -> list[int]:
        """The lengths that leave room for `extra` tokens in the engine's context."""
        return [n for n in lengths if n + extra < self.engine.max_model_len]

    def _fits(self, rows: int, tokens: int) -> bool:
        """Whether `rows` requests of `tokens` tokens each fit the KV cache and a step's seats at once."""
        blocks = rows * (tokens // self.engine.kv_cache.block_size + 1)
        return rows <= self.engine.config.scheduler.max_num_seqs and blocks <= self.engine.kv_cache.pool.num_blocks


def profile_steps(engine: LLMEngine, grid: ProfileGrid = ProfileGrid(), seed: int = 0,
                  on_progress: Callable[[str], None] = lambda what: None, warm_pass: bool = False) -> list[StepSample]:  # fmt: skip
    """Run `grid` on `engine` (left with no request) and return a sample per step (`StepProfiler.run`)."""
    return StepProfiler(engine, seed, on_progress).run(grid, warm_pass)
