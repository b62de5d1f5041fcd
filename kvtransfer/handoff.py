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
themselves (in-process) or `EncodedCalls` over actor handles (Ray).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Protocol

from kvtransfer.codec import decode, encode
from kvtransfer.protocol import DecodeReservation, GenerateRequest, PrefillTask, ReserveRefused, WorkerLoad


class HandoffError(RuntimeError):
    """The request could not be started (refused by decode, or no room before the deadline)."""


class DecodeEndpoint(Protocol):
    def reserve(self, request: GenerateRequest) -> DecodeReservation | ReserveRefused: ...
    def abort(self, request_id: str) -> None: ...


class PrefillEndpoint(Protocol):
    def prefill(self, task: PrefillTask) -> None: ...
    def abort(self, request_id: str) -> None: ...


@dataclass(frozen=True)
class HandoffTimeouts:
    reserve_retry_s: float = 0.02  # between reserve attempts while decode has no free blocks
    reserve_wait_s: float = 30.0  # then the request fails with a clear error


def start_request(
    request: GenerateRequest,
    decode_worker: DecodeEndpoint,
    prefill_worker: PrefillEndpoint | None,
    timeouts: HandoffTimeouts = HandoffTimeouts(),
) -> DecodeReservation:
    """Reserve on decode, then (unless decode prefills locally) hand the prompt to prefill.

    Returns once both workers hold the request; tokens then arrive on `request.stream_address`.
    Raises `HandoffError` when decode refuses it, or stays full past `reserve_wait_s`."""
    deadline = time.monotonic() + timeouts.reserve_wait_s
    while True:
        reply = decode_worker.reserve(request)
        if isinstance(reply, DecodeReservation):
            break
        if not reply.retryable:
            raise HandoffError(f"decode refused request {request.request_id}: {reply.reason}")
        if time.monotonic() >= deadline:
            raise HandoffError(
                f"no decode room for request {request.request_id} within {timeouts.reserve_wait_s}s: {reply.reason}"
            )
        time.sleep(timeouts.reserve_retry_s)
    if reply.prefill_locally:
        return reply
    if prefill_worker is None:
        decode_worker.abort(request.request_id)
        raise HandoffError(f"request {request.request_id} needs a prefill worker and none was given")
    try:
        prefill_worker.prefill(PrefillTask(request, reply))
    except Exception:
        decode_worker.abort(request.request_id)
        raise
    return reply


def abort_request(request_id: str, decode_worker: DecodeEndpoint, prefill_worker: PrefillEndpoint | None) -> None:
    """Client cancellation: both sides stop and free what they hold."""
    if prefill_worker is not None:
        prefill_worker.abort(request_id)
    decode_worker.abort(request_id)


class EncodedCalls:
    """An endpoint over `call(method, payload) -> reply`, e.g. Ray actor methods taking msgpack bytes.

    Every message crosses as `kvtransfer.codec` bytes; only ids and booleans go bare."""

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
