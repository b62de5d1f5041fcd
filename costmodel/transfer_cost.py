"""The price of moving one request's KV from a prefill worker to a decode worker.

    seconds(bytes) = latency_s + bytes / bytes_per_s

The sender streams each layer as soon as the forward has written it, so most of a transfer overlaps
the prefill step that computes it; the simulator (`planner.sim`) applies that overlap, this prices the
bytes alone.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class TransferCost:
    latency_s: float = 0.0
    bytes_per_s: float = float("inf")

    def __post_init__(self):
        if not self.latency_s >= 0 or not self.bytes_per_s > 0:
            raise ValueError(f"a transfer cost needs latency_s >= 0 and bytes_per_s > 0, got {self}")

    def seconds(self, num_bytes: int) -> float:
        return self.latency_s + num_bytes / self.bytes_per_s

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "TransferCost":
        return cls(float(data["latency_s"]), float(data["bytes_per_s"]))
