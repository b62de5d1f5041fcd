"""The engine's step runner in a simulation: a step is priced by the profile, not computed.

`LLMEngine` runs its real scheduler and bookkeeping around it; this stands where the model forward and
the sampler would. Each step advances the worker's clock (`SimClock`, the engine's `clock`) by the
profile's price for the step's shape, and "samples" one filler token per sampled row (the simulated
requests ignore EOS, so which token it is does not matter).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from costmodel import Neighbours, Profile, StepShape
from engine.sampler import SamplerOutput
from engine.scheduler import ScheduledRequest
from runtime.step_shapes import shape_of


class SimClock:
    """A worker's notion of now: set by the simulation at each round, advanced by each step's price."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class PricedBatch:
    shape: StepShape
    sampled_rows: int
    prompt_tokens: int  # the prefill chunks' tokens (the rest of `shape.tokens` are decode rows)
    prompt_spans: tuple = ()  # the simulated requests ask for no prompt logprobs


class PricedRunner:
    """`neighbours` says, when a step starts, what the host's other workers do (None: alone on its host): the
    served step's factor follows it and the step's share of prompt tokens, a step with prompt tokens takes longer
    while they decode, and every step for the tokens it streams out (`Profile.served_step_seconds`); a prefill
    worker's (`sends_kv`) also for the KV of its prompt tokens it streams to decode."""

    def __init__(self, profile: Profile, num_blocks: int, clock: SimClock, token_id: int,
                 neighbours: Callable[[], Neighbours | None] = lambda: None, sends_kv: bool = False):  # fmt: skip
        self.profile, self.num_blocks, self.clock, self.token_id = profile, num_blocks, clock, token_id
        self.neighbours, self.sends_kv = neighbours, sends_kv
        self.steps = 0
        self.busy_s = 0.0

    def prepare(self, scheduled: Sequence[ScheduledRequest]) -> PricedBatch:
        prompt_tokens = sum(s.num_new_tokens for s in scheduled if not s.is_decode)
        return PricedBatch(shape_of(scheduled), sum(1 for s in scheduled if s.samples), prompt_tokens)

    def execute(self, batch: PricedBatch, attachment: bytes = b"", layer_done=None) -> SamplerOutput:
        seconds = self.profile.served_step_seconds(batch.shape, batch.prompt_tokens, self.neighbours(), self.sends_kv)
        self.clock.now += seconds
        self.steps += 1
        self.busy_s += seconds
        return SamplerOutput([self.token_id] * batch.sampled_rows, [None] * batch.sampled_rows)

    def shutdown(self) -> None:
        pass
