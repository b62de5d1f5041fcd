"""A dispatcher over decode workers hosted in this process that prefill their own prompts (no prefill pool)."""

from __future__ import annotations

import contextlib

from router.control_client import control_endpoint
from router.dispatch import Dispatcher
from router.registry import WorkerRegistry
from router.token_stream import TokenStreamConsumer


@contextlib.asynccontextmanager
async def colocated_dispatcher(registry: WorkerRegistry, workers):
    """`registry` with `workers` (in-process actors, called over their control sockets) registered as its
    decode pool, and a colocated `Dispatcher` on it with the real token stream, closed at the end."""
    for worker in workers:
        registry.register(worker.config.name, "decode", control_endpoint(worker.control_address()))
    stream = TokenStreamConsumer()
    await stream.start()
    try:
        yield Dispatcher(registry, stream, colocated=True)
    finally:
        await stream.close()
