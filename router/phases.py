"""Where one sequence's time went, from arrival to its last token: phases that add up to its end-to-end time.

    queue          arrival -> its prompt's first step began (routing, handoff, hops, the worker's queue):
                   the time to first token less the prefill
    prefill        the prompt's first step -> the step that sampled the first token (the computing worker's)
    kv_transfer    the first token at decode -> the KV in (the part of the transfer the prefill did not hide)
    decode_seat    KV and first token in -> a seat in decode's running batch
    first_decode   the seat -> the step that made the second token
    decode         the rest: the remaining decode steps, until the last token

The workers measure their phases on their own clocks (`wire.requests.PhaseTimes`: the prefill worker's
with the first token, decode's with the final delta); the router holds the two ends (arrival, first and
last token), so `queue` and `decode` are what is left of its own intervals, and the phases add up to the
end-to-end time by construction. A remainder below zero means a worker's measure exceeds the router's
interval: a bug; it is shown as 0 and counted (`adds_up` False).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from wire.requests import PhaseTimes

TOLERANCE_S = 0.005  # clock reading and hop jitter between processes


@dataclass(frozen=True)
class RequestPhases:
    queue_s: float
    prefill_s: float
    kv_transfer_s: float
    decode_seat_s: float
    first_decode_s: float
    decode_s: float
    adds_up: bool = True

    @classmethod
    def of(cls, e2e_s: float, ttft_s: float, prompt: PhaseTimes | None, decode: PhaseTimes | None) -> "RequestPhases":
        """`prompt`: the phases of the worker that computed the prompt (a prefill worker, with the first token);
        `decode`: the decode worker's, with the final delta (it has the prompt's too when it prefilled it)."""
        decode = decode or PhaseTimes()
        prefill = (prompt or decode).prefill_s
        queue = ttft_s - prefill
        after_first = decode.kv_transfer_s + decode.decode_seat_s + decode.first_decode_s
        rest = e2e_s - ttft_s - after_first
        adds_up = queue > -TOLERANCE_S and rest > -TOLERANCE_S
        return cls(max(queue, 0.0), prefill, decode.kv_transfer_s, decode.decode_seat_s, decode.first_decode_s,
                   max(rest, 0.0), adds_up)  # fmt: skip

    @property
    def total_s(self) -> float:
        return self.queue_s + self.prefill_s + self.kv_transfer_s + self.decode_seat_s + self.first_decode_s + self.decode_s

    def to_dict(self) -> dict[str, float]:
        """As a response shows them (seconds, rounded to the microsecond)."""
        return {k: round(v, 6) for k, v in asdict(self).items() if k != "adds_up"}
