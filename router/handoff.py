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
they meet only through these messages. Endpoints are the worker objects
themselves (in-process) or `EncodedCalls` over actor handles (Ray); the router's
event loop uses the same protocol through `start_request_async` and `AsyncEncodedCalls`,
whose calls go over each worker's control socket (`router.control_client`).
"""

from __future__ import annotations

import asyncio
import functools
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Generator, Protocol

from wire.codec import decode, encode
from wire.requests import DecodeReservation, GenerateRequest, PrefillTask, ReserveRefused, WorkerLoad


class HandoffError(RuntimeError):
    """The request could not be started (refused by decode, or no room before the deadline).

    `retryable`: the same request may succeed later (decode was full); False: it never can run there."""

    def __init__(self, message: str, retryable: bool = False):
        super().__init__(message)
        self.retryable = retryable


class DecodeEndpoint(Protocol):
    def reserve(self, request: GenerateRequest) -> DecodeReservation | ReserveRefused: ...
    def abort(self, request_id: str) -> None: ...


class PrefillEndpoint(Protocol):
    def prefill(self, task: PrefillTask) -> None: ...
    def abort(self, request_id: str) -> None: ...


class AsyncDecodeEndpoint(Protocol):
    async def reserve(self, request: GenerateRequest) -> DecodeReservation | ReserveRefused: ...
    async def abort(self, request_id: str) -> None: ...


class AsyncPrefillEndpoint(Protocol):
    async def prefill(self, task: PrefillTask) -> None: ...
    async def abort(self, request_id: str) -> None: ...


@dataclass(frozen=True)
class HandoffTimeouts:
    reserve_retry_s: float = 0.02  # between reserve attempts while decode has no free blocks
    reserve_wait_s: float = 30.0  # then the request fails with a clear error


def _handoff(request: GenerateRequest, has_prefill: bool, timeouts: HandoffTimeouts) -> Generator:
    """The protocol itself, free of I/O: yields `(endpoint, method, argument)` calls and is sent their
    replies (or thrown their exceptions); returns the reservation. `endpoint` is "decode", "prefill",
    or None for a pause. `start_request` and `start_request_async` only carry the calls out."""
    deadline = time.monotonic() + timeouts.reserve_wait_s
    while True:
        reply = yield "decode", "reserve", request
        if isinstance(reply, DecodeReservation):
            break
        if not reply.retryable:
            raise HandoffError(f"decode refused request {request.request_id}: {reply.reason}")
        if time.monotonic() >= deadline:
            raise HandoffError(
                f"no decode room for request {request.request_id} within {timeouts.reserve_wait_s}s: {reply.reason}",
                retryable=True,
            )
        yield None, "sleep", timeouts.reserve_retry_s
    if reply.prefill_locally:
        return reply
    if not has_prefill:
        yield "decode", "abort", request.request_id
        raise HandoffError(f"request {request.request_id} needs a prefill worker and none was given", retryable=True)
    try:
        yield "prefill", "prefill", PrefillTask(request, reply)
    except Exception:
        yield "decode", "abort", request.request_id
        raise
    return reply


def start_request(
    request: GenerateRequest,
    decode_worker: DecodeEndpoint,
    prefill_worker: PrefillEndpoint | None,
    timeouts: HandoffTimeouts = HandoffTimeouts(),
) -> DecodeReservation:
    """Reserve on decode, then (unless decode prefills locally) hand the prompt to prefill.

    Returns once both workers hold the request; tokens then arrive on `request.stream_address`.
    Raises `HandoffError` when decode refuses it, or stays full past `reserve_wait_s`."""
    steps = _Steps(request, decode_worker, prefill_worker, timeouts, time.sleep)
    while (call := steps.next_call()) is not None:
        try:
            steps.reply = call()
        except Exception as e:
            steps.error = e
    return steps.result


async def start_request_async(
    request: GenerateRequest,
    decode_worker: AsyncDecodeEndpoint,
    prefill_worker: AsyncPrefillEndpoint | None,
    timeouts: HandoffTimeouts = HandoffTimeouts(),
) -> DecodeReservation:
    """`start_request` for an event loop: the same protocol, every call awaited (endpoint methods are coroutines)."""
    steps = _Steps(request, decode_worker, prefill_worker, timeouts, asyncio.sleep)
    while (call := steps.next_call()) is not None:
        try:
            steps.reply = await call()
        except Exception as e:
            steps.error = e
    return steps.result


class _Steps:
    """Walks `_handoff`: `next_call()` is the next endpoint call to make (None when done: see `result`);
    the driver sets `reply` or `error` from it."""

    def __init__(self, request, decode_worker, prefill_worker, timeouts: HandoffTimeouts, sleep: Callable):
        self._endpoints = {"decode": decode_worker, "prefill": prefill_worker, None: _Pause(sleep)}
        self._gen = _handoff(request, prefill_worker is not None, timeouts)
        self.reply, self.error, self.result = None, None, None

    def next_call(self) -> Callable | None:
        error, self.error = self.error, None
        try:
            endpoint, method, arg = self._gen.throw(error) if error else self._gen.send(self.reply)
        except StopIteration as done:
            self.result = done.value
            return None
        return functools.partial(getattr(self._endpoints[endpoint], method), arg)


class _Pause:
    def __init__(self, sleep: Callable[[float], object]):
        self.sleep = sleep


def abort_request(request_id: str, decode_worker: DecodeEndpoint, prefill_worker: PrefillEndpoint | None) -> None:
    """Client cancellation: both sides stop and free what they hold."""
    if prefill_worker is not None:
        prefill_worker.abort(request_id)
    decode_worker.abort(request_id)


async def abort_request_async(
    request_id: str, decode_worker: AsyncDecodeEndpoint, prefill_worker: AsyncPrefillEndpoint | None
) -> None:
    """`abort_request` for an event loop: both aborts are sent at once; the first failure is raised after both ran."""
    calls = [decode_worker.abort(request_id)] + ([prefill_worker.abort(request_id)] if prefill_worker else [])
    for result in await asyncio.gather(*calls, return_exceptions=True):
        if isinstance(result, BaseException):
            raise result


class EncodedCalls:
    """An endpoint over `call(method, payload) -> reply`, e.g. Ray actor methods taking msgpack bytes.

    Every message crosses as `wire.codec` bytes; only ids and booleans go bare."""

    def __init__(self, call: Callable[[str, object], object]):
        self._call = call

    def reserve(self, request: GenerateRequest) -> DecodeReservation | ReserveRefused:
        return decode(self._call("reserve", encode(request)), (DecodeReservation, ReserveRefused))

    def prefill(self, task: PrefillTask) -> None:
        self._call("prefill", encode(task))

    def abort(self, request_id: str) -> None:
        self._call("abort", request_id)

    def load(self) -> WorkerLoad:
        return decode(self._call("load", None), WorkerLoad)


class AsyncEncodedCalls:
    """`EncodedCalls` for an event loop: `call(method, payload)` returns an awaitable (a Ray ObjectRef is one)."""

    def __init__(self, call: Callable[[str, object], Awaitable], close: Callable[[], None] | None = None):
        self._call, self._close = call, close

    def close(self) -> None:
        """Release what the transport holds (sockets); idempotent. Later calls fail."""
        if self._close is not None:
            self._close()

    async def reserve(self, request: GenerateRequest) -> DecodeReservation | ReserveRefused:
        return decode(await self._call("reserve", encode(request)), (DecodeReservation, ReserveRefused))

    async def prefill(self, task: PrefillTask) -> None:
        await self._call("prefill", encode(task))

    async def abort(self, request_id: str) -> None:
        await self._call("abort", request_id)

    async def load(self) -> WorkerLoad:
        return decode(await self._call("load", None), WorkerLoad)
