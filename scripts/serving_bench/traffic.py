"""When requests are sent: Poisson (burstiness 1) or gamma arrivals at `request_rate`, all at once for inf."""

from __future__ import annotations

import math

import numpy as np


def arrival_gaps(rng: np.random.Generator, num: int, request_rate: float, burstiness: float = 1.0) -> list[float]:
    """Seconds to wait before each of `num` requests (the first waits too, as in a Poisson stream).

    Gamma(shape=burstiness, scale=1/(rate*burstiness)) keeps the mean gap at 1/rate: burstiness 1 is
    Poisson, below 1 burstier, above 1 more even.
    """
    if burstiness <= 0:
        raise ValueError(f"burstiness must be > 0, got {burstiness}")
    if math.isinf(request_rate):
        return [0.0] * num
    return rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=num).tolist()
