"""What serving adds around the engine's steps: the router's work per request and per token, the hops
between processes, and a worker loop's own work per round.

Defaults are the figures measured on the 2-core CPU machines; `tandem profile --serving` measures them for a
machine's profile (`cluster.serving_calibration`: a real `tandem serve` of that worker kind filling the
host, one request at a time, then under load). A published profile keeps the defaults: the router and
the worker loops are the same Python on any device.

A step's price is multiplied by how much slower the engine's steps run inside a served worker, where they
share the host with the router, Ray's daemons, the worker's own I/O thread and the host's other workers:

  step_factor        while the host's other workers step too (all of them; 10-25% slower than profiled
                     on the 2-core machines); 1.0 for a kind calibrated as the one worker of its host
  alone_step_factor  while none of the host's other workers has work, or it has none (None: not
                     measured, `step_factor` throughout). Serving itself slows a step even with no other
                     worker at work: the router, the clients and Ray share the cores, and a step's thread
                     they preempt holds the others at its next barrier. Served steps traced under load
                     (`cluster.calibration_steps`, Intel Xeon AVX-512, 2 cores, 2026-11-27) ran 1.1-1.3x
                     their profiled time, with ~1 ms between two steps (`per_round_s`)

Between the two, the factor moves with the share of the other workers that decode (`factor_at`, of
`Neighbours.decoding`: decode and colocated workers with work): decode steps are memory-bound and contend
for memory bandwidth with each other, while a prefill worker's compute-bound steps barely slow them. On 2
cores (AMD EPYC, 1 thread a worker, 2026-11-26 23:25-00:08), a decode worker beside a prefill worker busy
~90% of the time served TPOT 42-43 ms where the factor of two colocated workers decoding side by side
(1.26) predicted 58-59; counting only decoding neighbours, 1P+1D's TPOT p50 error over three passes of
bench_plan went from -6..+40% to -17..+18%.

  beside_prefill_factor
                     a decode step's factor while the host's other workers prefill (prefill workers with
                     work), between `alone_step_factor` and it by the share of them prefilling (None: not
                     measured, served as alone). On 2 cores (AMD EPYC, 1 thread a worker) a decode worker
                     beside a busy prefill worker was served as alone on 2026-11-26 and at ~1.2x on
                     2026-11-27 (1P+1D's TPOT under-predicted -5..-27%): the VM's own state, so it is
                     calibrated with the rest, per pass.

  prefill_factor     the same for a step's prompt tokens: measured on the idle requests' prefill (None:
                     the step factors for every token). Prompt tokens are compute-bound and barely feel
                     the neighbours: on 2 cores (AMD EPYC, 1 thread a worker) a 1,536-token prompt was
                     served at 1.02x its profiled time alone and 1.07x beside a busy neighbour, while decode
                     steps were served at 1.08x and 1.23x; one factor for both put every long prompt's
                     stall 15% too long, and with it the TPOT of the streams it stalled 18-51%.

A step's factor mixes the two by its share of prompt tokens (`factor_for`): a chunk of 1,536 prompt tokens
with five decode rows is served as a prompt, a decode batch as decode.

  per_served_row_s   added to a served step for each row it samples, either sign: what the served steps take per
                     row beyond the profile's price of it. Two things in one term, since the calibration sees
                     only their sum: what the router and the client spend on each streamed token comes out of
                     the steps where the workers' threads fill the host's cores (a preempted thread holds the
                     others at the next barrier), and the profile's own error in its price of a row (its grid
                     of isolated steps, fitted over 1-128 rows, prices some batch sizes high on one day and low
                     on another). A factor cannot follow either: both grow with the batch. In the served steps of
                     2026-11-27 18:30 (Intel Xeon AVX-512, 2 cores) the gap grew from 7 ms at one row to 16 ms
                     at 5-8, and a factor fitted to a load of 1-4 rows under-priced every larger batch
                     (bench_plan's long-outputs TPOT under-predicted 7-24%); on 2026-11-28 02:15 a profile that
                     priced 17-24-row steps 18% above their served time (and 1-row ones at it) left bursts'
                     TPOT over-predicted. Never below minus the profile's price of a decode row (the fit's
                     bound). 0 where not calibrated: a GPU host's cores are spare.

  prompt_contention_s, prompt_contention_per_token_s
                     the time a step with prompt tokens is served longer while the host's other workers
                     decode, as a line in its prompt tokens (`prompt_contention`, scaled by the share of
                     them decoding): a short prompt feels a decoding neighbour far more than its share of
                     compute says. On 2 cores (AMD EPYC, 1 thread a worker, 2026-11-27) a 128-token prompt
                     was prefilled in 180 ms alone and 203-241 ms while the decode worker of a 1P+1D
                     streamed, a 1,536-token one 1.05x its time alone: no factor fits both, and 1P+1D's time
                     to first token was under-predicted in every run of bench_plan (-6..-36% p50).

  kv_send_s, kv_send_per_token_s
                     the time a prefill worker's step with prompt tokens is served longer than a colocated
                     worker's, as a line in its prompt tokens (`kv_send`): it streams each layer's KV out as the
                     forward writes it, and the sends' work (the I/O thread's copies and socket writes, its turns
                     at the interpreter) shares the step's cores. On 2 cores (AMD EPYC, 1 thread a worker,
                     2026-11-28) a prefill worker with no neighbour at work prefilled 128-token prompts in 83-88 ms
                     and 768-token ones in 502-510 ms, where their price at the idle (colocated) prompt factor was
                     73 and 471, and every 1P+1D run's time to first token was under-predicted (-6..-25% p50).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields


@dataclass(frozen=True)
class Neighbours:
    """What a host's other workers do while a step runs: the share of them with work, and of them decoding."""

    busy: float
    decoding: float


_MAY_BE_NONE = ("alone_step_factor", "prefill_factor", "beside_prefill_factor")
_SIGNED = ("per_served_row_s",)
_RENAMED = {"per_streamed_token_s": "per_served_row_s"}  # profiles saved before 2026-11-28 02:30


@dataclass(frozen=True)
class ServingCost:
    request_s: float = 0.002  # router: HTTP body, tokenize, admit and route one request
    message_s: float = 0.0002  # one hop: a control call or a token delta between two processes on loopback
    per_round_s: float = 0.0005  # a worker loop's round around a step: mailbox, snapshot, deltas out
    per_delta_s: float = 0.0002  # one token delta: the worker sends it, the router detokenizes and streams it
    step_factor: float = 1.0  # served step / profiled step, the host's other workers busy (see the module doc)
    alone_step_factor: float | None = None  # the same, none of them busy; None: step_factor
    prefill_factor: float | None = None  # served / profiled time of prompt tokens; None: the step factors
    beside_prefill_factor: float | None = None  # a decode step beside prefilling neighbours; None: as alone
    prompt_contention_s: float = 0.0  # a step with prompt tokens, its other workers decoding: added seconds
    prompt_contention_per_token_s: float = 0.0  # ... and added seconds per prompt token of it
    per_served_row_s: float = 0.0  # a served step's added seconds per row it samples, signed (the module doc)
    kv_send_s: float = 0.0  # a prefill worker's step with prompt tokens: added seconds for streaming its KV out
    kv_send_per_token_s: float = 0.0  # ... and added seconds per prompt token of it

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.name in _MAY_BE_NONE or f.name in _SIGNED and math.isfinite(value):
                continue
            if not value >= 0:
                raise ValueError(f"serving cost {f.name} must be >= 0, got {value}")

    def factor_at(self, others_busy: float | None) -> float:
        """The served step over the profiled one while `others_busy` (0 to 1) of the host's other workers have
        work; None: the worker is alone on its host."""
        if self.alone_step_factor is None:
            return self.step_factor
        if others_busy is None:  # no neighbour to contend with: as alone
            return self.alone_step_factor
        return self.alone_step_factor + (self.step_factor - self.alone_step_factor) * others_busy

    def factor_for(self, neighbours: "Neighbours | None", prompt_share: float) -> float:
        """The served step over the profiled one for a step whose tokens are `prompt_share` (0 to 1) prompt
        tokens, the rest decode rows, beside `neighbours` (None: alone on its host): prompt tokens at their
        own factor, decode rows slowed by the neighbours that decode (memory-bound steps contend for memory
        bandwidth) and, where measured, by those that prefill (`beside_prefill_factor`)."""
        decode = self.factor_at(None if neighbours is None else neighbours.decoding)
        if neighbours is not None and self.beside_prefill_factor is not None and self.alone_step_factor is not None:
            decode += (self.beside_prefill_factor - self.alone_step_factor) * (neighbours.busy - neighbours.decoding)
        if self.prefill_factor is None:
            return decode
        return prompt_share * self.prefill_factor + (1.0 - prompt_share) * decode

    def prompt_contention(self, neighbours: "Neighbours | None", prompt_tokens: int) -> float:
        """The seconds a step with `prompt_tokens` prompt tokens is served longer beside `neighbours` (None:
        alone on its host) than alone: the calibrated line at the share of them decoding."""
        if neighbours is None or prompt_tokens == 0:
            return 0.0
        return neighbours.decoding * (self.prompt_contention_s + self.prompt_contention_per_token_s * prompt_tokens)

    def kv_send(self, prompt_tokens: int) -> float:
        """The seconds a prefill worker's step of `prompt_tokens` prompt tokens takes for streaming their KV out."""
        return self.kv_send_s + self.kv_send_per_token_s * prompt_tokens if prompt_tokens else 0.0

    def per_rows(self, sampled_rows: int) -> float:
        """The seconds a served step of `sampled_rows` sampled rows takes beyond its factored price (either sign)."""
        return self.per_served_row_s * sampled_rows

    def to_dict(self) -> dict[str, float | None]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ServingCost":
        return cls(**{_RENAMED.get(k, k): None if v is None else float(v) for k, v in data.items()})
