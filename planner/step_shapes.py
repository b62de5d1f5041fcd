"""The cost model's view of a step the engine's scheduler made (`costmodel.StepShape`)."""

from __future__ import annotations

from typing import Sequence

from costmodel import StepShape
from engine.scheduler import ScheduledRequest


def shape_of(scheduled: Sequence[ScheduledRequest]) -> StepShape:
    """Call before the step moves its requests on: `num_computed_tokens` is each one's context."""
    prefills, decodes = [], []
    for s in scheduled:
        context = s.request.num_computed_tokens
        if s.is_decode:
            decodes.append(context)
        else:
            prefills.append((s.num_new_tokens, context, s.samples))
    return StepShape.of(prefills, decodes)
