"""Service level objectives, as `tandem plan --slo ttft_p90=2s,tpot_p90=100ms,itl_p99=300ms` states them.

Each term bounds one percentile of one metric (`ttft`, `tpot`, `itl`, `e2el`; any percentile from p1 to
p100) over the requests of a run: a layout meets the SLO when every bound holds. Goodput counts the
requests that meet, each on its own, every bound on a per-request metric (TTFT, TPOT, E2EL: vLLM's
`--goodput`), per second; ITL bounds are about a stream's worst stalls and judge the layout only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from planner.bench_metrics import percentile_key

_TERM = re.compile(r"^(ttft|tpot|itl|e2el)_p(\d+(?:\.\d+)?)$")
_VALUE = re.compile(r"^(\d+(?:\.\d+)?)(ms|s)$")


@dataclass(frozen=True)
class Bound:
    metric: str  # ttft | tpot | itl | e2el
    percentile: float
    limit_ms: float

    @property
    def key(self) -> str:
        """The result key it reads (`p90_ttft_ms`)."""
        return percentile_key(self.metric, self.percentile)

    def __str__(self) -> str:
        return f"{self.metric}_p{self.percentile:g}<={self.limit_ms:g}ms"


@dataclass(frozen=True)
class SLO:
    bounds: tuple[Bound, ...]

    @classmethod
    def parse(cls, text: str) -> "SLO":
        """"ttft_p90=2s,tpot_p90=100ms" -> SLO; a bad term is a ValueError naming it."""
        bounds = []
        for term in filter(None, (t.strip() for t in text.split(","))):
            name, sep, value = term.partition("=")
            match, amount = _TERM.match(name.strip()), _VALUE.match(value.strip())
            if not sep or match is None:
                raise ValueError(f"--slo {term!r}: name a metric and a percentile, like ttft_p90=2s (metrics: ttft, "
                                 "tpot, itl, e2el)")  # fmt: skip
            if amount is None or float(amount[1]) <= 0:
                raise ValueError(f"--slo {term!r}: the bound must be a positive time in ms or s, like 100ms or 2s")
            percentile = float(match[2])
            if not 0 < percentile <= 100:
                raise ValueError(f"--slo {term!r}: the percentile must be within (0, 100]")
            scale = 1000.0 if amount[2] == "s" else 1.0
            bounds.append(Bound(match[1], percentile, float(amount[1]) * scale))
        if not bounds:
            raise ValueError("--slo: give at least one bound, like ttft_p90=2s,tpot_p90=100ms")
        return cls(tuple(bounds))

    @property
    def metrics(self) -> list[str]:
        return sorted({b.metric for b in self.bounds})

    @property
    def percentiles(self) -> list[float]:
        return sorted({b.percentile for b in self.bounds})

    def per_request_limits(self) -> dict[str, float]:
        """vLLM's goodput SLOs: the tightest bound on each per-request metric, ms."""
        limits: dict[str, float] = {}
        for b in self.bounds:
            if b.metric != "itl":
                limits[b.metric] = min(limits.get(b.metric, b.limit_ms), b.limit_ms)
        return limits

    def misses(self, result: dict) -> list[str]:
        """The bounds a run's result (vLLM's keys) breaks, each with the value it had."""
        return [f"{b.key} {result[b.key]:.0f} > {b.limit_ms:g} ms" for b in self.bounds if result[b.key] > b.limit_ms]

    def __str__(self) -> str:
        return ", ".join(str(b) for b in self.bounds)
