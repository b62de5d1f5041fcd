"""The requests a simulation serves, in `vllm bench serve`'s own terms, or read from a trace file.

    WorkloadSpec(dataset_name="random", random_input_len=1536, random_output_len=200,
                 request_rate=0.4, num_prompts=16, ignore_eos=True).requests()

Datasets as vLLM's benchmark draws them (token ids, no text: the simulator needs counts and prefixes):
  - random: input and output lengths uniform in [len * (1 - range_ratio), len * (1 + range_ratio)],
    after `random_prefix_len` tokens every prompt shares;
  - prefix_repetition: `num_prefixes` prefixes of `prefix_len` tokens, each prompt one of them plus its
    own `suffix_len` tokens: num_prompts // num_prefixes prompts of each (vLLM sends no more), in the
    order vLLM sends them (its list, prefix by prefix, shuffled by Python's `random` seeded with `seed`).
    Which prefix comes when decides the cache's misses: with 8 prefixes over 40 prompts on two workers,
    another order moved the simulated TTFT p50 from 264 to 854 ms.
Arrivals as vLLM's client times them (`vllm.benchmarks.serve.get_request`): one gap per request drawn from
Gamma(burstiness, 1 / (rate * burstiness)) (Poisson at burstiness 1) by numpy's global generator seeded
with `seed`, summed, then scaled so the last request goes at exactly num_prompts / rate; `request_rate`
inf sends all at once. vLLM's prefix_repetition dataset draws its prompts' token ids from that same
generator first (a prefix's tokens, then each of its prompts' suffix tokens, uniform below the tokenizer's
vocabulary size), so the gaps come after those draws; they are replayed here with `vocab_size`, the
model's. Without them the simulated arrivals of 40 prompts at 1.2/s were others than vLLM's, and the
simulated TTFT p90 was 65% above the measured one; with them every arrival matched vLLM's to the
millisecond (SmolLM2). The replay holds while the model's vocabulary size is the tokenizer's (SmolLM2's
49,152; not Llama 3's: 128,256 against 128,000) and no prompt re-encodes shorter than asked (vLLM then
draws more tokens for it); otherwise the arrivals are as random as vLLM's, with other draws.
`max_concurrency` is the client's: a request also waits for one of that many slots (`planner.sim.run`).

A model's end-of-sequence cannot be simulated: every request generates its whole output length, as
with `--ignore-eos` (a spec without it says so in `caveats`).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, fields
from typing import Literal, Sequence

import numpy as np

DATASETS = ("random", "prefix_repetition")


@dataclass(frozen=True)
class SimRequest:
    arrival_s: float  # when the client may send it (it may also wait for a concurrency slot)
    prompt: tuple[int, ...]
    output_len: int


@dataclass(frozen=True)
class WorkloadSpec:
    """`vllm bench serve`'s workload flags, under its names (dashes as underscores), with its defaults."""

    dataset_name: Literal["random", "prefix_repetition"] = "random"
    num_prompts: int = 1000
    random_input_len: int = 1024
    random_output_len: int = 128
    random_range_ratio: float = 0.0
    random_prefix_len: int = 0
    prefix_repetition_prefix_len: int = 256
    prefix_repetition_suffix_len: int = 256
    prefix_repetition_num_prefixes: int = 10
    prefix_repetition_output_len: int = 128
    request_rate: float = math.inf
    burstiness: float = 1.0
    max_concurrency: int | None = None
    seed: int = 0
    ignore_eos: bool = False

    def __post_init__(self):
        problems = []
        if self.dataset_name not in DATASETS:
            problems.append(f"--dataset-name: {self.dataset_name!r} is not simulated (use {' or '.join(DATASETS)})")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.endswith(("_len", "num_prompts", "num_prefixes")) and (not isinstance(value, int) or value < 0):
                problems.append(f"--{f.name.replace('_', '-')}: must be a whole number >= 0, got {value!r}")
        if self.num_prompts < 1:
            problems.append(f"--num-prompts: must be >= 1, got {self.num_prompts}")
        if not 0 <= self.random_range_ratio < 1:
            problems.append(f"--random-range-ratio: must be in [0, 1), got {self.random_range_ratio}")
        if not self.request_rate > 0:
            problems.append(f"--request-rate: must be > 0 (inf: all at once), got {self.request_rate}")
        if not self.burstiness > 0:
            problems.append(f"--burstiness: must be > 0, got {self.burstiness}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            problems.append(f"--max-concurrency: must be >= 1, got {self.max_concurrency}")
        if self.dataset_name == "prefix_repetition" and not 1 <= self.prefix_repetition_num_prefixes <= self.num_prompts:
            problems.append(f"--prefix-repetition-num-prefixes: must be >= 1 and at most --num-prompts "
                            f"({self.num_prompts}), got {self.prefix_repetition_num_prefixes}")  # fmt: skip
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def caveats(self) -> tuple[str, ...]:
        return () if self.ignore_eos else ("without --ignore-eos a real run may stop early at EOS; the simulation "
                                           "generates every request's full output length",)  # fmt: skip

    def requests(self, vocab_size: int = 32000) -> list[SimRequest]:
        rng = np.random.default_rng(self.seed)
        tokens = _TokenSource(rng, vocab_size)
        if self.dataset_name == "random":
            prompts, outputs = self._random(rng, tokens)
        else:
            prompts, outputs = self._prefix_repetition(rng, tokens)
        arrivals = vllm_arrival_times(self.seed, len(prompts), self.request_rate, self.burstiness,
                                      self.global_token_draws(), vocab_size)  # fmt: skip
        return [SimRequest(a, p, o) for a, p, o in zip(arrivals, prompts, outputs)]

    def _random(self, rng, tokens: "_TokenSource"):
        in_lo, in_hi = length_range(self.random_input_len, self.random_range_ratio)
        out_lo, out_hi = length_range(self.random_output_len, self.random_range_ratio)
        inputs = rng.integers(in_lo, in_hi + 1, self.num_prompts)
        outputs = rng.integers(out_lo, out_hi + 1, self.num_prompts)
        prefix = tokens.draw(self.random_prefix_len)
        prompts = [prefix + tokens.draw(int(n)) for n in inputs]
        return prompts, [int(n) for n in outputs]

    def _prefix_repetition(self, rng, tokens: "_TokenSource"):
        groups = self.prefix_repetition_num_prefixes
        per_group = self.num_prompts // groups
        prompts = []
        for _ in range(groups):
            prefix = tokens.draw(self.prefix_repetition_prefix_len)
            prompts += [prefix + tokens.draw(self.prefix_repetition_suffix_len) for _ in range(per_group)]
        random.Random(self.seed).shuffle(prompts)  # vLLM seeds Python's random with --seed; nothing else draws
        return prompts, [self.prefix_repetition_output_len] * len(prompts)

    def global_token_draws(self) -> list[int]:
        """How many token ids each draw vLLM's dataset makes from numpy's global generator before its client
        draws the gaps, in order: none for random (it has a generator of its own)."""
        if self.dataset_name != "prefix_repetition":
            return []
        per_group = self.num_prompts // self.prefix_repetition_num_prefixes
        group = [self.prefix_repetition_prefix_len] + [self.prefix_repetition_suffix_len] * per_group
        return group * self.prefix_repetition_num_prefixes


def length_range(length: int, range_ratio: float) -> tuple[int, int]:
    """Inclusive [low, high] around `length`: length * (1 -/+ range_ratio), never below 1."""
    if not 0 <= range_ratio < 1:
        raise ValueError(f"range ratio must be in [0, 1), got {range_ratio}")
    return max(1, int(np.floor(length * (1 - range_ratio)))), max(1, int(np.ceil(length * (1 + range_ratio))))


def arrival_gaps(rng: np.random.Generator, num: int, request_rate: float, burstiness: float = 1.0) -> list[float]:
    """`num` gaps between requests: Gamma(shape=burstiness, scale=1/(rate*burstiness)), mean 1/rate; burstiness
    1 is Poisson, below 1 burstier, above 1 more even; all 0 at an infinite rate."""
    if burstiness <= 0:
        raise ValueError(f"burstiness must be > 0, got {burstiness}")
    if math.isinf(request_rate):
        return [0.0] * num
    return rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=num).tolist()


def vllm_arrival_times(seed: int, num: int, request_rate: float, burstiness: float = 1.0,
                       drawn_before: Sequence[int] = (), vocab_size: int = 0) -> list[float]:  # fmt: skip
    """When `vllm bench serve --seed seed` sends each of `num` requests, from its start (see the module doc);
    `drawn_before`: how many token ids (below `vocab_size`) each draw of its dataset took from the same
    generator first."""
    if burstiness <= 0:
        raise ValueError(f"burstiness must be > 0, got {burstiness}")
    if math.isinf(request_rate):
        return [0.0] * num
    state = np.random.RandomState(seed)  # vLLM seeds numpy's global generator and draws one gap at a time
    for count in drawn_before:
        state.randint(0, vocab_size, size=count)  # how many bits each draw takes depends on the bound: replay it
    delays = np.cumsum([state.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness)) for _ in range(num)])
    return (delays * (num / request_rate) / delays[-1]).tolist()


class _TokenSource:
    """Token ids away from the special ones at the bottom of a vocabulary; no two draws share a block by chance."""

    def __init__(self, rng: np.random.Generator, vocab_size: int):
        self.rng, self.low, self.high = rng, min(100, vocab_size // 4), vocab_size

    def draw(self, n: int) -> tuple[int, ...]:
        return tuple(self.rng.integers(self.low, self.high, n).tolist()) if n else ()
