"""The router's side of `cluster.membership`: keep the registry equal to what the controller wants.

Runs as a task on the router's event loop (the registry's owner): report what
the registry holds over the controller's membership socket
(`cluster.membership_service`), await the wanted membership (a long poll), then
register / drain / unregister to match. A restarted worker comes back under its
name with a new incarnation: the old one is unregistered first (the dispatcher
fails what it held). A restarted controller wants the same workers under the
same incarnations (their actor ids), so the registry keeps them as they are.

Where the socket is comes from `locate` (in a deployment, one Ray call to the
controller actor, which waits while Ray restarts it). A sync that fails (the
connection dropped, no reply in time) closes the connection and locates the
controller again: a restarted controller listens on a new port.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from router.control_client import ControlClient, control_endpoint
from wire.membership import LatencyTotals, MemberView, MembershipReport, WantedMember, WantedMembership
from wire.socket_security import ClusterKey

logger = logging.getLogger("tandem.cluster")

# A sync waits at most the controller's poll interval (a fraction of a second) for its reply; a controller
# that does not answer for this long (stopped, or its process wedged) is located and connected to anew.
SYNC_TIMEOUT_S = 30.0


class RouterSync:
    def __init__(self, registry, locate: Callable[[], Awaitable[str]] | None = None, latency_totals=dict,
                 key: ClusterKey | None = None, retry_s: float = 1.0):  # fmt: skip
        self.registry = registry
        self.locate = locate  # async () -> the controller's membership address
        self.key = key  # the cluster key of the controller's and the workers' sockets (RouterConfig.cluster_key)
        self.latency_totals = latency_totals  # () -> the router's cumulative TTFT / TPOT (for the autoscaler)
        self.retry_s = retry_s
        self._incarnation: dict[str, str] = {}  # name -> incarnation the registry holds
        self._version = -1

    def report(self) -> MembershipReport:
        views = tuple(MemberView(name, self._incarnation.get(name, ""), state.alive, state.draining,
                                 state.in_flight, state.load)
                      for name, state in self.registry.workers.items())  # fmt: skip
        return MembershipReport(self._version, views, LatencyTotals.from_dict(self.latency_totals()))

    def apply(self, wanted: WantedMembership) -> None:
        self._version = wanted.version
        by_name = {entry.name: entry for entry in wanted.members}
        for name in list(self.registry.workers):
            entry = by_name.get(name)
            if entry is None or entry.incarnation != self._incarnation.get(name):
                self.registry.unregister(name)
                self._incarnation.pop(name, None)
        for entry in wanted.members:
            if entry.name not in self.registry.workers:
                self.registry.register(entry.name, entry.role, self._endpoint(entry), entry.sender_key)
                self._incarnation[entry.name] = entry.incarnation
            if entry.draining and not self.registry.workers[entry.name].draining:
                self.registry.drain(entry.name)

    def _endpoint(self, entry: WantedMember):
        return control_endpoint(entry.control_address, key=self.key)

    async def run(self) -> None:
        """Until cancelled. A failed sync (the controller restarting, Ray busy) is retried, never fatal."""
        client = None
        try:
            while True:
                try:
                    client = client or ControlClient(await self.locate(), SYNC_TIMEOUT_S, self.key)
                    wanted = await client.call("sync", self.report())
                    if not isinstance(wanted, WantedMembership):
                        raise TypeError(f"the controller answered {type(wanted).__name__}")
                    self.apply(wanted)
                except asyncio.CancelledError:
                    raise
                except Exception as err:
                    logger.warning("membership sync failed (%s: %s); retrying", type(err).__name__, err)
                    if client is not None:
                        client.close()
                    client = None
                    await asyncio.sleep(self.retry_s)
        finally:
            if client is not None:
                client.close()
