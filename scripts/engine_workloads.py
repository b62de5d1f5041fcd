"""The workloads `bench_engine.py` runs, the same for every engine, and what a run of one measured.

(a) batch 1: one short prompt, a long output; (b) many requests with ShareGPT-like spreads of prompt
and output lengths (lognormal, seeded); a short warm-up that touches both prefill and decode.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field

# Workload (a).
A_PROMPT_LEN = 32
A_OUTPUT_LEN = 128
# Workload (b): lognormal lengths, clipped. Medians and spreads are picked to look like
# ShareGPT conversations (long-tailed, most prompts and replies short) while keeping the
# whole run within a few minutes on a 2-core CPU.
B_PROMPT_MEDIAN, B_PROMPT_SIGMA, B_PROMPT_RANGE = 96, 0.8, (16, 512)
B_OUTPUT_MEDIAN, B_OUTPUT_SIGMA, B_OUTPUT_RANGE = 64, 0.7, (16, 256)
# Warm-up: short, but it prefills and decodes, so both code paths are initialised.
WARMUP_PROMPT_LEN, WARMUP_OUTPUT_LEN = 16, 4

# A fixed vocabulary for prompt text: real words tokenize like real text, unlike random ids.
WORDS = """
the of and to in is was that for on as with by at from his her they have this which
one had not but what all were when we there can an your said each she do how their if
will up other about out many then them these so some would make like him into time has
look two more write go see number no way could people my than first water been call who
oil its now find long down day did get come made may part over new sound take only little
work know place year live me back give most very after thing our just name good sentence
man think say great where help through much before line right too mean old any same tell
boy follow came want show also around form three small set put end does another well large
must big even such because turn here why ask went men read need land different home us move
try kind hand picture again change off play spell air away animal house point page letter
mother answer found study still learn should world high every near add food between own
below country plant last school father keep tree never start city earth eye light thought
head under story saw left few while along might close something seem next hard open example
begin life always those both paper together got group often run important until children
side feet car mile night walk white sea began grow took river four carry state once book
hear stop without second later miss idea enough eat face watch far really almost let above
girl sometimes mountain cut young talk soon list song being leave family question engine
""".split()


# ----------------------------------------------------------------------------- data


@dataclass
class Workload:
    """Prompts as token ids and the number of output tokens wanted for each."""

    name: str
    description: str
    prompts: list[list[int]]
    output_lens: list[int]

    @property
    def total_output(self) -> int:
        return sum(self.output_lens)


@dataclass
class Result:
    """One engine on one workload; derived rates are computed, not stored."""

    engine: str
    workload: str
    output_tokens: int
    wall_s: float
    num_steps: int
    step_time_s: float
    extra: dict = field(default_factory=dict)

    @property
    def tok_s(self) -> float:
        return self.output_tokens / self.wall_s

    @property
    def mean_step_ms(self) -> float:
        return 1000 * self.step_time_s / max(1, self.num_steps)

    def to_json(self) -> dict:
        return {**asdict(self), "tok_s": self.tok_s, "mean_step_ms": self.mean_step_ms}


def random_text_ids(tokenizer, num_tokens: int, rng: random.Random) -> list[int]:
    """Token ids of random text from WORDS, cut to exactly `num_tokens`."""
    words: list[str] = []
    ids: list[int] = []
    while len(ids) < num_tokens:
        # Words are about one token each; ask for what is missing plus a margin.
        words += [rng.choice(WORDS) for _ in range(num_tokens - len(ids) + 8)]
        ids = tokenizer.encode(" ".join(words), add_special_tokens=False)
    return ids[:num_tokens]


def lognormal_int(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    return min(hi, max(lo, round(rng.lognormvariate(math.log(median), sigma))))


def scaled(n: int, scale: float) -> int:
    return max(1, round(n * scale))


def workload_a(tokenizer, seed: int, scale: float) -> Workload:
    rng = random.Random(seed)
    out = scaled(A_OUTPUT_LEN, scale)
    return Workload(
        name="a",
        description=f"batch 1: {A_PROMPT_LEN}-token prompt, {out} output tokens",
        prompts=[random_text_ids(tokenizer, A_PROMPT_LEN, rng)],
        output_lens=[out],
    )


def workload_b(tokenizer, num_requests: int, seed: int, scale: float) -> Workload:
    # A different stream from (a), so the two never share a prompt prefix.
    rng = random.Random(seed + 1)
    prompt_lens = [lognormal_int(rng, B_PROMPT_MEDIAN, B_PROMPT_SIGMA, *B_PROMPT_RANGE) for _ in range(num_requests)]
    output_lens = [
        scaled(lognormal_int(rng, B_OUTPUT_MEDIAN, B_OUTPUT_SIGMA, *B_OUTPUT_RANGE), scale)
        for _ in range(num_requests)
    ]
    prompts = [random_text_ids(tokenizer, n, rng) for n in prompt_lens]
    desc = (
        f"{num_requests} requests: prompt {min(prompt_lens)}..{max(prompt_lens)} "
        f"(mean {sum(prompt_lens) / num_requests:.0f}), output {min(output_lens)}..{max(output_lens)} "
        f"(mean {sum(output_lens) / num_requests:.0f}) tokens"
    )
    return Workload("b", desc, prompts, output_lens)


def warmup_workload(tokenizer) -> Workload:
    rng = random.Random(12345)
    return Workload("warmup", "warm-up", [random_text_ids(tokenizer, WARMUP_PROMPT_LEN, rng)], [WARMUP_OUTPUT_LEN])


# ----------------------------------------------------------------------------- bandwidth bound
