"""A tensor-parallel follower rank as a long-lived service: its forward loop on one thread, its I/O on another.

The forward thread spends its time inside the step broadcast (`TPFollower.run`).
Whatever else the rank does, receiving or sending its own KV heads for a
disaggregated worker, runs on its I/O thread (`runtime.io_thread`), whose
services the role builds from the follower (they read or write its KV cache);
the role's connector, if any, is the forward thread's way to reach them.
`endpoint()` is the bytes rank 0 needs to reach this rank.

A follower rank's Ray actor is its role's one actor class (`runtime.actor`),
whose `start(init_addr, leader_key)` builds a `FollowerHost` (joining the group blocks
until every rank joined, so the caller starts all ranks at once).
"""

from __future__ import annotations

import logging
import threading

from engine.config import EngineConfig
from engine.parallel.follower import TPFollower
from runtime.io_thread import IOThread
from wire.codec import encode
from wire.ranks import RankEndpoint
from wire.socket_security import sender_public_key

logger = logging.getLogger("tandem.runtime")


class FollowerRole:
    """What a role runs on a follower rank (subclassed by prefill and decode): on its I/O thread, the rank
    link's service (`control`, a `runtime.rank_control_service.RankControlService`) and the role's KV service
    (`kv`, a `runtime.transfer_service.TransferService`)."""

    def __init__(self, config, leader_key: str = ""):
        self.config = config  # the role's worker config: name, addresses and timeouts
        self.leader_key = leader_key  # rank 0's sender key: the only one its rank link admits (with a cluster key)
        self.control = self.kv = None  # built by `services`

    def services(self, follower: TPFollower, io: IOThread) -> list:
        """The I/O thread's services (built on that thread): `control` and `kv`."""
        raise NotImplementedError

    def connector(self, follower: TPFollower, io: IOThread):
        """The forward thread's `engine.kv_connector.FollowerConnector`, or None."""
        return None

    def endpoint(self) -> bytes:
        """How rank 0 reaches this rank (an encoded `RankEndpoint`), once the services exist."""
        raise NotImplementedError

    def rank_endpoint(self, kv_address: str = "") -> bytes:
        """`endpoint()`'s answer: this rank's control socket, `kv_address`, and the key its acks come with."""
        return encode(RankEndpoint(self.kv.rank, self.control.control.address, kv_address, sender_public_key()))

    def is_idle(self) -> bool:
        """Nothing in flight (read after the forward loop ended)."""
        return not self.kv.endpoint.pending()


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
