"""Admission by predicted time to first token: refuse at once (429) what would wait too long, instead of
accepting it and letting it queue (Mooncake's early rejection).

    predicted TTFT on worker W = (prompt tokens queued on W + this request's) / W's prompt rate

  - queued: the prompt tokens the router sent W to compute whose first token has not come yet
    (`WorkerState.prompt_tokens_queued`, kept by the dispatcher: exact and with no reporting lag);
  - rate: prompt tokens per second of W's steps, measured by W itself (`engine.prefill_meter`,
    reported in each `WorkerLoad`) over its recent load reports (`PromptRate`).

A request is refused only when even the best worker that could compute its prompt (the prefill pool;
the decode pool when colocated, or when no prefill worker is pickable) predicts more than the deadline;
a worker with no measured rate yet predicts nothing, so a fresh server admits everything. Retry-After
says when the queue will have drained enough.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Sequence

from wire.requests import WorkerLoad

_WINDOW = 32  # load reports the rate is measured over (about half a minute at the default refresh)
_MIN_SECONDS = 0.2  # of prompt steps in the window before it is trusted over the cumulative figure


class PromptRate:
    """A worker's prompt tokens per second, from the cumulative figures of its load reports."""

    def __init__(self):
        self._readings: deque[tuple[int, float]] = deque(maxlen=_WINDOW)

    def observe(self, load: WorkerLoad) -> None:
        reading = (load.prompt_tokens_advanced, load.prompt_seconds)
        if self._readings and reading[0] < self._readings[-1][0]:
            self._readings.clear()  # the worker started over (a restart): its counters did too
        self._readings.append(reading)

    @property
    def settled(self) -> bool:
        """True when its window holds one reading only: no prompt work for a whole window, so the rate is the
        cumulative one and stays put until the worker computes a prompt again."""
        return len(self._readings) == _WINDOW and self._readings[0] == self._readings[-1]

    @property
    def tokens_per_s(self) -> float | None:
        """None until the worker has computed a prompt."""
        if not self._readings or self._readings[-1][1] <= 0:
            return None
        (tokens0, seconds0), (tokens, seconds) = self._readings[0], self._readings[-1]
        if seconds - seconds0 >= _MIN_SECONDS:
            return (tokens - tokens0) / (seconds - seconds0)
        return tokens / seconds


def predicted_ttft_s(workers: Sequence, prompt_tokens: int) -> float | None:
    """The shortest predicted TTFT over `workers` (`WorkerState`s); None when none has a rate yet."""
    predictions = [(w.prompt_tokens_queued + prompt_tokens) / rate
                   for w in workers if (rate := w.prompt_rate.tokens_per_s)]  # fmt: skip
    return min(predictions, default=None)


class FirstTokenTooLate(Exception):
    """The request's first token is predicted later than the deadline: refused (429), nothing held."""

    def __init__(self, predicted_s: float, deadline_s: float):
        super().__init__(f"the server is too busy to start this request within {deadline_s:g} s (its first "
                         f"token is predicted in {predicted_s:.0f} s); retry later")  # fmt: skip
        self.retry_after_s = max(1, math.ceil(predicted_s - deadline_s))  # when the queue will have drained


def check_ttft(workers: Sequence, prompt_tokens: int, deadline_s: float) -> None:
    """Raise `FirstTokenTooLate` when the prompt's first token is predicted later than `deadline_s` (0: none)."""
    if not deadline_s:
        return
    predicted = predicted_ttft_s(workers, prompt_tokens)
    if predicted is not None and predicted > deadline_s:
        raise FirstTokenTooLate(predicted, deadline_s)
