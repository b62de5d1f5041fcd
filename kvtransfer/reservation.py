"""Destination blocks reserved for one request on the decode side, and what has landed in them.

A request is complete when every (layer, block, local head) has been written
once, in whatever order chunks came: per layer, per prefill chunk, or from
several prefill ranks each sending some heads (re-sharding).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from wire.socket_security import holds_token


@dataclass
class Reservation:
    block_ids: tuple[int, ...]
    deadline: float  # receiver clock time after which the transfer has timed out
    position: dict[int, int]  # block id -> index in block_ids
    # [num_layers, len(block_ids), local_heads] bool: written so far. numpy, not torch: it is
    # updated and checked once per arriving message, and numpy does that in a fraction of torch's time.
    covered: np.ndarray
    contributors: set[bytes] = field(default_factory=set)  # ZMQ identities of senders filling it
    bytes_written: int = 0  # K and V bytes landed so far
    first_write_at: float | None = None  # receiver clock time of the first landed chunk
    transfer_token: str = ""  # what its chunks and a sender's Abort must carry ("": anything, no cluster key)

    @classmethod
    def create(cls, block_ids, num_layers: int, local_heads: int, deadline: float,
               transfer_token: str = "") -> "Reservation":  # fmt: skip
        block_ids = tuple(int(b) for b in block_ids)
        covered = np.zeros((num_layers, len(block_ids), local_heads), dtype=bool)
        return cls(block_ids, deadline, {b: i for i, b in enumerate(block_ids)}, covered,
                   transfer_token=transfer_token)  # fmt: skip

    def admits(self, transfer_token: str) -> bool:
        """Whether a message carrying `transfer_token` may write into or end this reservation."""
        return holds_token(self.transfer_token, transfer_token)

    def holds(self, start: int, length: int) -> bool:
        """Whether blocks [start, start + length) are all reserved here."""
        return all(b in self.position for b in range(start, start + length))

    def mark_written(self, layer: int, start: int, length: int, heads: slice) -> None:
        first = self.position[start]
        self.covered[layer, first : first + length, heads] = True

    @property
    def complete(self) -> bool:
        return bool(self.covered.all())
