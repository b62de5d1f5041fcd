"""What serving adds around the engine's steps: the router's work per request and per token, the hops
between processes, and a worker loop's own work per round.

Defaults are the figures measured on the 2-core CPU machines; `tandem profile --serving` measures them for a
machine's profile (`cluster.serving_calibration`: a real `tandem serve` of that worker kind filling the
host, one request at a time, then under load). A published profile keeps the defaults: the router and
the worker loops are the same Python on any device.

`step_factor` multiplies every step's price: the engine's steps inside a served worker, on a host whose
cores its workers fill, share them with the router, Ray's daemons and the worker's own I/O thread, and
ran 10-25% slower than the same steps profiled alone on the 2-core machines.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields


@dataclass(frozen=True)
class ServingCost:
    request_s: float = 0.002  # router: HTTP body, tokenize, admit and route one request
    message_s: float = 0.0002  # one hop: a control call or a token delta between two processes on loopback
    per_round_s: float = 0.0005  # a worker loop's round around a step: mailbox, snapshot, deltas out
    per_delta_s: float = 0.0002  # one token delta: the worker sends it, the router detokenizes and streams it
    step_factor: float = 1.0  # served step / profiled step (see the module doc)

    def __post_init__(self):
        for f in fields(self):
            if not getattr(self, f.name) >= 0:
                raise ValueError(f"serving cost {f.name} must be >= 0 seconds, got {getattr(self, f.name)}")

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ServingCost":
        return cls(**{k: float(v) for k, v in data.items()})
