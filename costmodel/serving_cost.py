"""What serving adds around the engine's steps: the router's work per request and per token, the hops
between processes, and a worker loop's own work per round.

Defaults are the figures measured on the 2-core CPU machines (`planner.calibration` measures them
again for a machine: a short served run against the engine's own steps); a published profile keeps
them, as the router and the worker loops are the same Python on any device.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields


@dataclass(frozen=True)
class ServingCost:
    request_s: float = 0.002  # router: HTTP body, tokenize, admit and route one request
    message_s: float = 0.0002  # one hop: a control call or a token delta between two processes on loopback
    per_round_s: float = 0.0015  # a worker loop's round around a step: mailbox, snapshot, deltas out
    per_delta_s: float = 0.0002  # one token delta: the worker sends it, the router detokenizes and streams it

    def __post_init__(self):
        for f in fields(self):
            if not getattr(self, f.name) >= 0:
                raise ValueError(f"serving cost {f.name} must be >= 0 seconds, got {getattr(self, f.name)}")

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ServingCost":
        return cls(**{k: float(v) for k, v in data.items()})
