"""The router's side of `cluster.membership`: keep the registry equal to what the controller actor wants.

Runs as a task on the router's event loop (the registry's owner): report what
the registry holds, await the controller's wanted membership (a Ray call,
awaited without blocking the loop), then register / drain / unregister to
match. A restarted worker comes back under its name with a new incarnation:
the old one is unregistered first (the dispatcher fails what it held). A
restarted controller wants the same workers under the same incarnations (their
actor ids), so the registry keeps them as they are; a sync that fails while the
controller restarts is retried.
"""

from __future__ import annotations

import asyncio
import logging

from cluster.membership import RouterView, WantedWorker
from wire.codec import encode

logger = logging.getLogger("tandem.cluster")


class RouterSync:
    def __init__(self, registry, controller, latency_totals=dict, key=None, retry_s: float = 1.0):
        self.registry = registry
        self.key = key  # the cluster key the workers' control sockets demand (RouterConfig.cluster_key)
        self.controller = controller  # the ControllerActor handle
        self.latency_totals = latency_totals  # () -> the router's cumulative TTFT / TPOT (for the autoscaler)
        self.retry_s = retry_s
        self._incarnation: dict[str, str] = {}  # name -> incarnation the registry holds
        self._version = -1

    def report(self) -> dict[str, RouterView]:
        views = {}
        for name, state in self.registry.workers.items():
            load = encode(state.load) if state.load is not None else None
            incarnation = self._incarnation.get(name, "")
            views[name] = RouterView(incarnation, state.alive, state.draining, state.in_flight, load)
        return views

    def apply(self, wanted: list[WantedWorker]) -> None:
        by_name = {entry.name: entry for entry in wanted}
        for name in list(self.registry.workers):
            entry = by_name.get(name)
            if entry is None or entry.incarnation != self._incarnation.get(name):
                self.registry.unregister(name)
                self._incarnation.pop(name, None)
        for entry in wanted:
            if entry.name not in self.registry.workers:
                self.registry.register(entry.name, entry.role, entry.worker.endpoint(self.key))
                self._incarnation[entry.name] = entry.incarnation
            if entry.draining and not self.registry.workers[entry.name].draining:
                self.registry.drain(entry.name)

    async def run(self) -> None:
        """Until cancelled. A failed sync (the controller restarting, Ray busy) is retried, never fatal."""
        while True:
            try:
                reply = self.controller.sync.remote(self.report(), self._version, self.latency_totals())
                self._version, wanted = await reply
                self.apply(wanted)
            except asyncio.CancelledError:
                raise
            except Exception as err:
                logger.warning("membership sync failed (%s: %s); retrying", type(err).__name__, err)
                await asyncio.sleep(self.retry_s)
