"""The router's calls to a worker's control socket (`runtime.control_service`, `router.control_client`).

    router DEALER ── ControlCall(call_id, "reserve" | "prefill" | "abort" | "load", payload) ──► worker ROUTER
    router DEALER ◄── ControlReply(call_id, payload | error) ── worker (in any order: matched by call_id)
"""

from __future__ import annotations

from wire.codec import message


@message
class ControlCall:
    call_id: int
    method: str
    payload: bytes | str | None  # what the Ray actor method of the same name takes (msgpack bytes or an id)


@message
class ControlReply:
    call_id: int
    payload: bytes | str | None = None
    error: str = ""  # set when the call failed
    rejected: bool = False  # the call's own fault (bad payload, unknown method): the worker is fine
