"""The handoff protocol between the router, one decode worker and one prefill worker, in one place.

    router                         decode worker                 prefill worker
    start_request(req) ── reserve ─► blocks for the prompt (prefix hits kept),
                      ◄─ DecodeReservation: KV address, inbox, block ids
                         (or prefill_locally: short prompt, decode computes it;
                          or ReserveRefused: full now → retried until a deadline)
                      ── PrefillTask ─────────────────────────► queue, batch, compute
                                                   ◄═ KV blocks ══ first token sampled
         token stream ◄──────────────────── TokenDelta(first token) ── at once (TTFT)
                                  inbox ◄── FirstToken ───────────────
                                  receiver done ══ TransferDone ══► frees its blocks
                                  admit, decode ...
         token stream ◄── TokenDelta ... finished, usage
    abort_request(id) ── abort ─► both sides free what they hold (each side's abort is idempotent)

Tensor parallel: a decode worker of TP=b answers with every rank's KV address
(`DecodeReservation.kv_addresses`, `tp_size`); each prefill rank sends its
pieces of `resharding.plan` straight to the decode ranks that need them.

Failures: a transfer that fails or expires, or a prefill that fails, ends the
request on decode (every rank) with a final TokenDelta whose `error` says why;
the prefill frees its blocks once every transfer of the request has ended, and
fails the request when one of them fails. The workers never import each other:
they meet only through these messages. The router runs this protocol on its
event loop; each call goes over the worker's control socket
(`router.control_client.ControlEndpoint`), the one way requests reach a worker.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Protocol

from wire.requests import DecodeReservation, GenerateRequest, PrefillTask, ReserveRefused


class HandoffError(RuntimeError):
    """The request could not be started (refused by decode, or no room before the deadline).

    `retryable`: the same request may succeed later (decode was full); False: it never can run there."""

    def __init__(self, message: str, retryable: bool = False):
        super().__init__(message)
        self.retryable = retryable


class DecodeEndpoint(Protocol):
    async def reserve(self, request: GenerateRequest) -> DecodeReservation | ReserveRefused: ...
    async def abort(self, request_id: str) -> None: ...


class PrefillEndpoint(Protocol):
    async def prefill(self, task: PrefillTask) -> None: ...
    async def abort(self, request_id: str) -> None: ...


@dataclass(frozen=True)
class HandoffTimeouts:
    reserve_retry_s: float = 0.02  # before the second reserve attempt while decode has no free blocks
    reserve_retry_max_s: float = 0.5  # the wait doubles after each refusal up to this (each attempt hashes the
    # prompt on decode's loop: a full decode is asked 4 times in its first second, not 50)
    reserve_wait_s: float = 30.0  # then the request fails with a clear error

    def retry_after(self, refusals: int) -> float:
        """How long to wait after the `refusals`-th refusal (1, 2, ...) before asking decode again."""
        return min(self.reserve_retry_max_s, self.reserve_retry_s * 2 ** min(refusals - 1, 32))


async def start_request(request: GenerateRequest, decode_worker: DecodeEndpoint, prefill_worker: PrefillEndpoint | None,
                        timeouts: HandoffTimeouts = HandoffTimeouts()) -> DecodeReservation:  # fmt: skip
    """Reserve on decode, then (unless decode prefills locally) hand the prompt to prefill.

    Returns once both workers hold the request; tokens then arrive on `request.stream_address`.
    Raises `HandoffError` when decode refuses it, or stays full past `reserve_wait_s`; whatever
    prefill raises, after aborting the reservation on decode."""
    reservation = await _reserve(request, decode_worker, timeouts)
    if reservation.prefill_locally:
        return reservation
    if prefill_worker is None:
        await decode_worker.abort(request.request_id)
        raise HandoffError(f"request {request.request_id} needs a prefill worker and none was given", retryable=True)
    try:
        await prefill_worker.prefill(PrefillTask(request, reservation))
    except Exception:
        await decode_worker.abort(request.request_id)
        raise
    return reservation


async def _reserve(request: GenerateRequest, decode_worker: DecodeEndpoint, timeouts: HandoffTimeouts):
    """Decode's reservation, asked again after `retry_after` while decode is full, until `reserve_wait_s`."""
    deadline, refusals = time.monotonic() + timeouts.reserve_wait_s, 0
    while True:
        reply = await decode_worker.reserve(request)
        if isinstance(reply, DecodeReservation):
            return reply
        if not reply.retryable or reply.busy:  # busy: no retry within the wait would find room
            raise HandoffError(f"decode refused request {request.request_id}: {reply.reason}", retryable=reply.busy)
        if time.monotonic() >= deadline:
            raise HandoffError(f"no decode room for request {request.request_id} within {timeouts.reserve_wait_s}s: "
                               f"{reply.reason}", retryable=True)  # fmt: skip
        refusals += 1
        await asyncio.sleep(timeouts.retry_after(refusals))


async def abort_request(request_id: str, decode_worker: DecodeEndpoint,
                        prefill_worker: PrefillEndpoint | None = None) -> None:  # fmt: skip
    """Client cancellation: both aborts are sent at once, both sides free what they hold (each side's
    abort is idempotent); the first failure is raised after both ran."""
    calls = [decode_worker.abort(request_id)] + ([prefill_worker.abort(request_id)] if prefill_worker else [])
    for result in await asyncio.gather(*calls, return_exceptions=True):
        if isinstance(result, BaseException):
            raise result
