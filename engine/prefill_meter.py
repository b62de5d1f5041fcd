"""How fast an engine gets through prompts, measured on its own steps: what a router predicts TTFT from.

    advanced = prompt_tokens_advanced(sched)   before a step updates its requests (`LLMEngine.step`)
    meter.record(advanced, seconds)             after it succeeded
    meter.tokens, meter.seconds    cumulative: prompt tokens advanced, and the wall time of the steps
                                   that advanced any (a worker reports both in its `WorkerLoad`)

A prompt token is "advanced" when a step computes it, or when the prefix cache
served it (credited on the request's first prompt chunk): the router charges a
request its whole prompt, so the rate is measured in the same tokens. A step
that mixes decodes with a prompt chunk counts whole, because the decodes it
carries slow the prompt down just as much.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.scheduler import ScheduledRequest, SchedulerOutput


@dataclass
class PrefillMeter:
    tokens: int = 0
    seconds: float = 0.0

    def record(self, advanced: int, seconds: float) -> None:
        if advanced:
            self.tokens += advanced
            self.seconds += seconds


def prompt_tokens_advanced(sched: SchedulerOutput) -> int:
    """Prompt tokens the scheduled step moves past (call before the step updates `num_computed_tokens`)."""
    return sum(_advanced(s) for s in sched.scheduled)


def _advanced(s: ScheduledRequest) -> int:
    req = s.request
    done = req.num_computed_tokens
    computed = max(0, min(done + s.num_new_tokens, req.num_prompt_tokens) - done)
    first_chunk = computed and done == req.num_cached_tokens and not req.output_token_ids
    return computed + (req.num_cached_tokens if first_chunk else 0)
