"""Prompt logprobs: for each prompt token after the first, its logprob given the tokens before it (and the
top alternatives), computed from the hidden states of the step that computes the prompt.

Position p's logits score token p + 1, so a chunk of prompt positions [start, end) gives the entries of
tokens start + 1 .. end (the last prompt position scores the first output token, which is sampled, not
scored here). The vocabulary projection runs over a few hundred rows at a time: a whole 2048-token chunk
of a 49k vocabulary would be 400 MB of float32 logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.sampler import TokenLogprobs, logprob_entries

ROWS_AT_ONCE = 256


@dataclass(frozen=True)
class PromptSpan:
    """The rows of one step's batch whose logits score prompt tokens of one request."""

    index: int  # the request's place in the step's scheduled list
    first_row: int  # row of the batch holding prompt position `first_position`
    targets: tuple[int, ...]  # the prompt tokens scored: those at first_position + 1, ...
    top: int  # alternatives per entry (params.prompt_logprobs)


def prompt_span(index: int, first_row: int, prompt: list[int], start: int, end: int, top: int) -> PromptSpan | None:
    """The span of a chunk computing prompt positions [start, end) of `prompt`, or None if it scores nothing."""
    last = min(end, len(prompt) - 1)  # the last prompt position scores an output token
    if last <= start:
        return None
    return PromptSpan(index, first_row, tuple(prompt[start + 1 : last + 1]), top)


def span_logprobs(project, hidden: torch.Tensor, span: PromptSpan) -> list[TokenLogprobs]:
    """Entries for span.targets; `project(rows)` gives the vocabulary logits of hidden rows."""
    entries = []
    for offset in range(0, len(span.targets), ROWS_AT_ONCE):
        targets = list(span.targets[offset : offset + ROWS_AT_ONCE])
        rows = hidden[span.first_row + offset : span.first_row + offset + len(targets)]
        chosen = torch.tensor(targets, device=rows.device)  # [rows]
        entries += logprob_entries(project(rows), chosen, targets, [span.top] * len(targets))
    return entries
