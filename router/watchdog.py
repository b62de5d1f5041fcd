"""The router's watchdog: a request that gets no token for too long is ended with a clear error.

Every `RequestOutputs` notes when a delta last arrived (or when its attempt
started). A request silent for `limit_s` (a worker wedged, a KV transfer
stuck, a token stream lost) gets `RequestTimedOut` on its stream: the client
sees the error, and closing the generation aborts it on its workers, which
free its blocks. A request being resumed on other workers is left alone (its
resumption restarts the clock).
"""

from __future__ import annotations

import asyncio
import logging
import time

from router.dispatch import Dispatcher
from router.token_stream import StreamFailed

logger = logging.getLogger("tandem.router")


class RequestTimedOut(StreamFailed):
    """No token arrived for the watchdog's limit."""


def end_silent_requests(dispatcher: Dispatcher, limit_s: float, now: float | None = None) -> list[str]:
    """Fail every request silent for `limit_s`; return their ids."""
    now = time.monotonic() if now is None else now
    silent = [
        gen for gen in list(dispatcher.active.values())
        if gen.resuming is None and not gen.closed and now - gen.outputs.last_activity > limit_s
    ]  # fmt: skip
    for gen in silent:
        logger.warning("request %s got no token for %.0fs: ending it", gen.request_id, limit_s)
        gen.outputs.put(RequestTimedOut(f"no token for {limit_s:g}s from workers {_names(gen)}"))
    return [gen.request_id for gen in silent]


async def watch(dispatcher: Dispatcher, limit_s: float) -> None:
    """Run until cancelled: check every request a few times per `limit_s`."""
    while True:
        await asyncio.sleep(max(0.05, limit_s / 4))
        end_silent_requests(dispatcher, limit_s)


def _names(gen) -> str:
    return ", ".join(w.name for w in (gen.decode, gen.prefill) if w is not None)
