"""A tensor-parallel follower rank as a long-lived service: its forward loop on one thread, its I/O on another.

The forward thread spends its time inside the step broadcast (`TPFollower.run`).
Whatever else the rank does, receiving or sending its own KV heads for a
disaggregated worker, runs on its I/O thread (`runtime.io_thread`), whose
services the role builds from the follower (they read or write its KV cache);
the role's connector, if any, is the forward thread's way to reach them.
`endpoint()` is the bytes rank 0 needs to reach this rank.

`FollowerActor` is the Ray actor body: cheap to construct, `start(init_addr)`
joins the group (it blocks until every rank joined, so the caller starts all
ranks at once), `shutdown()` after rank 0's shutdown waits for the loop to end.
"""

from __future__ import annotations

import dataclasses
import logging
import threading

from engine.config import EngineConfig
from engine.parallel.follower import TPFollower
from runtime.io_thread import IOThread
from runtime.worker_config import on_this_node

logger = logging.getLogger("tandem.runtime")


class FollowerRole:
    """What a role runs on a follower rank (subclassed by prefill and decode)."""

    def services(self, follower: TPFollower, io: IOThread) -> list:
        """The I/O thread's services (built on that thread)."""
        raise NotImplementedError

    def connector(self, follower: TPFollower, io: IOThread):
        """The forward thread's `engine.kv_connector.FollowerConnector`, or None."""
        return None

    def endpoint(self) -> bytes:
        """How rank 0 reaches this rank (an encoded `RankEndpoint`), once the services exist."""
        raise NotImplementedError

    def is_idle(self) -> bool:
        """Nothing in flight (read after the forward loop ended)."""
        return True


class FollowerHost:
    def __init__(self, config: EngineConfig, role: FollowerRole, name: str):
        self.name, self.role = name, role
        self.follower = TPFollower(config)  # joins the process group: returns once every rank has
        self.io = IOThread(f"{name}-io", lambda io: role.services(self.follower, io))
        self.follower.kv_connector = role.connector(self.follower, self.io)
        self._forward = threading.Thread(target=self._run_forward, name=f"{name}-forward", daemon=True)
        self._forward.start()

    def _run_forward(self) -> None:
        try:
            self.follower.run()
        except Exception:
            logger.exception("%s: the forward loop failed", self.name)

    def shutdown(self, timeout_s: float = 30.0) -> bool:
        """After rank 0 shut down: wait for the forward loop, then stop the I/O thread.

        True if the forward loop ended and nothing was in flight."""
        self._forward.join(timeout_s)
        ended = not self._forward.is_alive()
        if not ended:
            logger.error("%s: the forward loop did not end within %ss of shutdown", self.name, timeout_s)
        idle = self.role.is_idle()
        self.io.stop()
        return ended and idle


class FollowerActor:
    """Body of a follower rank's Ray actor; subclasses say what the rank runs (`role()`)."""

    def __init__(self, engine_args, config, torch_threads: int | None, rank: int):
        if torch_threads is not None:
            import torch

            torch.set_num_threads(torch_threads)
        self.engine_args, self.config, self.rank = engine_args, on_this_node(config), rank
        self.name = f"{config.name}-rank{rank}"  # config: the role's worker config (it has a name)
        self.host: FollowerHost | None = None

    def role(self) -> FollowerRole:
        raise NotImplementedError

    def start(self, init_addr: str) -> bytes:
        """Join rank 0 at `init_addr`, start both threads; return this rank's endpoint for rank 0."""
        args = dataclasses.replace(self.engine_args, tensor_parallel_rank=self.rank, dist_init_addr=init_addr)
        role = self.role()
        self.host = FollowerHost(args.create_engine_config(), role, self.name)
        return role.endpoint()

    def shutdown(self) -> bool:
        return self.host is not None and self.host.shutdown()
