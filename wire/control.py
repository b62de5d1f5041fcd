"""The router's calls to a worker's control socket (`runtime.control_service`, `router.control_client`).

    router DEALER ── ControlCall(call_id, "reserve" | "prefill" | "abort" | "load", payload) ──► worker ROUTER
    router DEALER ◄── ControlReply(call_id, payload | error) ── worker (in any order: matched by call_id)
"""

from __future__ import annotations

from wire.codec import message
from wire.requests import DecodeReservation, GenerateRequest, PrefillTask, ReserveRefused, WorkerLoad

# What a call carries: reserve a GenerateRequest, prefill a PrefillTask, abort a request id, load nothing.
CallPayload = GenerateRequest | PrefillTask | str | None
# What a reply carries: reserve's answer, load's WorkerLoad, nothing (prefill, abort), or a string.
ReplyPayload = DecodeReservation | ReserveRefused | WorkerLoad | str | None


@message
class ControlCall:
    call_id: int
    method: str
    payload: CallPayload  # a message nested in this one (one codec pass, one type check)


@message
class ControlReply:
    call_id: int
    payload: ReplyPayload = None
    error: str = ""  # set when the call failed
    rejected: bool = False  # the call's own fault (bad payload, unknown method): the worker is fine
