"""The KV connector: the seam through which a worker moves KV out of (or into) the engine's paged cache.

The engine owns it and calls it on its own thread, at two explicit call sites:

    engine.step()
      sched = scheduler.schedule()
      attachment = connector.before_forward(sched)     requests whose prompt this forward completes
                                                       (their blocks are all allocated): open their
                                                       transfers; bytes for the tensor-parallel ranks
      runner.execute(batch, attachment, connector.save_layer)
        model forward: after layer L's attention ──► connector.save_layer(L)
                       (layer L's KV of this step is in the cache; layers L+1.. still compute)

A tensor-parallel follower rank calls the same two hooks (`FollowerConnector`):
`on_step(attachment)` with rank 0's bytes, then `save_layer(L)` per layer.

Neither hook may block (no handshake, no wait for a peer): a connector hands the
work to its I/O thread and returns. Ownership of blocks does not move through
here: the engine keeps a finished prefill request's blocks (`Request.hold_blocks`)
until the worker says the transfer ended (`engine.remote_kv.release_blocks`), and a
decode request waiting for remote KV is the scheduler's (`Scheduler.waiting_for_kv`).
"""

from __future__ import annotations

from typing import Protocol

from engine.scheduler import SchedulerOutput


class KVConnector(Protocol):
    def before_forward(self, sched: SchedulerOutput) -> bytes:
        """Called before each non-empty forward; returns the attachment for follower ranks (b"" for none)."""

    def save_layer(self, layer: int) -> None:
        """Layer `layer`'s KV of the forward under way is in the cache."""


class FollowerConnector(Protocol):
    def on_step(self, attachment: bytes) -> None:
        """Rank 0's attachment of the step this rank is about to run."""

    def save_layer(self, layer: int) -> None:
        """As `KVConnector.save_layer`, on this rank's cache."""
