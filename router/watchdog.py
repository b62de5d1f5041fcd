"""The router's watchdog: a request that gets no token for too long is moved to other workers.

Every `RequestOutputs` notes when a delta last arrived (or when its attempt
started). A request silent for `limit_s` (a message lost, a worker wedged in a
way its heartbeat does not show) is resumed on other workers, as if its
workers had failed it (`Dispatcher.resume`, `router.migration`): the client
sees no error, only a pause. Once its resumes are spent it ends with
`RequestTimedOut`. The limit is longer than a KV transfer's deadline
(`TransferTimeouts.transfer_s`), so a slow transfer ends on its own terms
first (decode then prefills the prompt itself), and a request being resumed
is left alone (its resumption restarts the clock).
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


def resume_silent_requests(dispatcher: Dispatcher, limit_s: float, now: float | None = None) -> list[str]:
    """Resume every running request silent for `limit_s` (or end it, its resumes spent); return their ids."""
    now = time.monotonic() if now is None else now
    silent = [gen for gen in list(dispatcher.active.values()) if gen.silent_for(now) > limit_s]
    for gen in silent:
        why = f"no token for {limit_s:g}s from workers {', '.join(w.name for w in gen.attempt.workers)}"
        logger.warning("request %s: %s", gen.request_id, why)
        dispatcher.resume(gen, why, RequestTimedOut)
    return [gen.request_id for gen in silent]


async def watch(dispatcher: Dispatcher, limit_s: float) -> None:
    """Run until cancelled: check every request a few times per `limit_s`."""
    while True:
        await asyncio.sleep(max(0.05, limit_s / 4))
        resume_silent_requests(dispatcher, limit_s)
