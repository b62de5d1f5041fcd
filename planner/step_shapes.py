"""The cost model's view of a step the engine's scheduler made (`costmodel.StepShape`)."""

from __future__ import annotations

from typing import Sequence

from costmodel import StepShape, chunk_attention_pairs
from engine.scheduler import ScheduledRequest


def shape_of(scheduled: Sequence[ScheduledRequest]) -> StepShape:
    """Call before the step moves its requests on: `num_computed_tokens` is each one's context.
    (`StepShape.of`'s counts, in one pass: the simulator prices every step it runs.)"""
    tokens = sampled = decode_ctx = longest = prefill_ctx = 0
    pairs = 0.0
    for s in scheduled:
        context, new = s.request.num_computed_tokens, s.num_new_tokens
        tokens += new
        if new == 1:  # a decode row (ScheduledRequest.is_decode)
            sampled += 1
            decode_ctx += context + 1
            longest = max(longest, context + 1)
        else:
            sampled += s.samples
            pairs += chunk_attention_pairs(new, context)
            prefill_ctx += new + context
    return StepShape(tokens, len(scheduled), sampled, decode_ctx, pairs, prefill_ctx, longest)
