"""A follower rank as a long-lived service: its forward loop on one thread, its I/O on another.

The forward thread spends its time inside the step broadcast (`TPFollower.run`),
so whatever else the rank does, a KV receiver or sender for a disaggregated
worker, runs on an I/O worker of its own: a `Steppable` on a `StepLoop`, built
from the follower (it writes or reads the follower's KV cache). The engine
knows nothing about what that worker does; `endpoint()` is the bytes it gives
rank 0 to reach it.

`FollowerActor` is the Ray actor body: cheap to construct, `start(init_addr)`
joins the group (it blocks until every rank joined, so the caller starts all
ranks at once), `shutdown()` after rank 0's shutdown waits for the loop to end.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Callable, Protocol

from engine.config import EngineConfig
from engine.parallel.follower import TPFollower
from engine.step_loop import StepLoop, Steppable

logger = logging.getLogger("tandem.engine")


class FollowerIO(Steppable, Protocol):
    def endpoint(self) -> bytes:
        """How rank 0 reaches this worker (encoded by the layer that defines it)."""

    def is_idle(self) -> bool: ...


class FollowerHost:
    def __init__(self, config: EngineConfig, make_io: Callable[[TPFollower], FollowerIO], name: str):
        self.name = name
        self.follower = TPFollower(config)  # joins the process group: returns once every rank has
        self.io: StepLoop = StepLoop(lambda: make_io(self.follower), f"{name}-io")
        self.steps = 0
        self._forward = threading.Thread(target=self._run_forward, name=f"{name}-forward", daemon=True)
        self._forward.start()

    def _run_forward(self) -> None:
        try:
            self.steps = self.follower.run()
        except Exception:
            logger.exception("%s: the forward loop failed", self.name)

    def shutdown(self, timeout_s: float = 30.0) -> bool:
        """After rank 0 shut down: wait for the forward loop, then stop the I/O worker.

        True if the forward loop ended and the I/O worker held nothing (no transfer under way)."""
        self._forward.join(timeout_s)
        ended = not self._forward.is_alive()
        if not ended:
            logger.error("%s: the forward loop did not end within %ss of shutdown", self.name, timeout_s)
        idle = self.io.call(lambda io: io.is_idle())
        self.io.stop()
        return ended and idle


class FollowerActor:
    """Body of a follower rank's Ray actor; subclasses say how to build the I/O worker (`make_io`)."""

    def __init__(self, engine_args, config, torch_threads: int | None, rank: int):
        if torch_threads is not None:
            import torch

            torch.set_num_threads(torch_threads)
        self.engine_args, self.config, self.rank = engine_args, config, rank
        self.name = f"{config.name}-rank{rank}"  # config: the role's worker config (it has a name)
        self.host: FollowerHost | None = None

    def make_io(self, follower: TPFollower) -> FollowerIO:
        raise NotImplementedError

    def start(self, init_addr: str) -> bytes:
        """Join rank 0 at `init_addr`, start both loops; return the I/O worker's endpoint for rank 0."""
        args = dataclasses.replace(self.engine_args, tensor_parallel_rank=self.rank, dist_init_addr=init_addr)
        self.host = FollowerHost(args.create_engine_config(), self.make_io, self.name)
        return self.host.io.call(lambda io: io.endpoint())

    def shutdown(self) -> bool:
        return self.host is not None and self.host.shutdown()
