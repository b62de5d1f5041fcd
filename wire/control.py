"""The router's calls to a worker's control socket (`runtime.control_service`, `router.control_client`).

    router DEALER ── ControlCall(call_id, "reserve" | "prefill" | "abort" | "load", payload) ──► worker ROUTER
    router DEALER ◄── ControlReply(call_id, payload | error) ── worker (in any order: matched by call_id)

The controller's membership socket speaks the same envelope with one method, "sync" (`wire.membership`).
"""

from __future__ import annotations

from wire.codec import DecodeError, decode, message
from wire.membership import MembershipReport, WantedMembership
from wire.requests import DecodeReservation, GenerateRequest, PrefillTask, ReserveRefused, WorkerLoad

# What a call carries: reserve a GenerateRequest, prefill a PrefillTask, abort a request id, load nothing;
# to the controller, sync a MembershipReport.
CallPayload = GenerateRequest | PrefillTask | MembershipReport | str | None
# What a reply carries: reserve's answer, load's WorkerLoad, nothing (prefill, abort; a prefill refused as busy:
# ReserveRefused), a string;
# from the controller, sync's WantedMembership.
ReplyPayload = DecodeReservation | ReserveRefused | WorkerLoad | WantedMembership | str | None


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


def read_call(frames: list[bytes]) -> tuple[bytes, ControlCall]:
    """(the caller's identity, its call) from the frames a ROUTER received; `DecodeError` for anything else."""
    if len(frames) != 2:
        raise DecodeError(f"{len(frames) - 1} frames instead of 1")
    return frames[0], decode(frames[1], ControlCall)
