"""The cost model's view of a step the engine's scheduler made (`costmodel.StepShape`): what a served worker's
step trace records (`runtime.step_trace`), the profiler times and the simulator prices."""

from __future__ import annotations

from typing import Sequence

from costmodel import StepShape, chunk_attention_pairs
from engine.scheduler import ScheduledRequest


def shape_of(scheduled: Sequence[ScheduledRequest]) -> StepShape:
    """Call before the step moves its requests on: `num_computed_tokens` is each one's context.
    (`StepShape.of`'s counts, in one pass: the simulator prices every step it runs.)"""
    tokens = sampled = decode_ctx = longest = prefill_ctx = 0
    pairs = prefix_pairs = 0.0
    for s in scheduled:
        context, new = s.request.num_computed_tokens, s.num_new_tokens
        tokens += new
        if new == 1:  # a decode row (ScheduledRequest.is_decode)
            sampled += 1
            decode_ctx += context + 1
            longest = max(longest, context + 1)
        else:
            sampled += s.samples
            chunk_pairs = chunk_attention_pairs(new, context)
            pairs += chunk_pairs
            prefix_pairs += chunk_pairs if context else 0.0
            prefill_ctx += new + context
    return StepShape(tokens, len(scheduled), sampled, decode_ctx, pairs, prefill_ctx, longest, prefix_pairs)


def prefill_chunks(scheduled: Sequence[ScheduledRequest]) -> tuple[tuple[int, int], ...]:
    """Each prefill chunk of the step as (new tokens, context tokens): the evidence a shape's counts sum up,
    kept beside them so that a cost term the counts do not give can be fitted again from measured steps."""
    return tuple((s.num_new_tokens, s.request.num_computed_tokens) for s in scheduled if not s.is_decode)


class RecordingRunner:
    """An engine's runner, plus the shape of the step it was last asked to prepare (read before the step moves
    its requests on), its prompt tokens (the prefill chunks'; the rest are decode rows) and its prefill chunks.
    The profiler and a served worker's step trace (`runtime.step_trace`) put one in place of `engine.runner`;
    `last_shape` is theirs to take (and to set back to None)."""

    def __init__(self, inner):
        self.inner, self.last_shape, self.last_chunks = inner, None, ()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    @property
    def last_prompt_tokens(self) -> int:
        return sum(new for new, _ in self.last_chunks)

    def prepare(self, scheduled):
        self.last_shape = shape_of(scheduled)
        self.last_chunks = prefill_chunks(scheduled)
        return self.inner.prepare(scheduled)
