"""The controller's membership channel: the router's registry as it is, the workers the controller wants there.

    router DEALER ── ControlCall(id, "sync", MembershipReport) ──► controller's ROUTER (its membership thread)
    router DEALER ◄── ControlReply(id, WantedMembership) ──────── once the wanted membership differs from
                                                                   `known_version`, or after a poll interval

The same control sockets and call/reply envelope as a worker's (`wire.control`): the router's report is
a long poll, so each report is both a heartbeat and the ack the controller waits for after a change.
"""

from __future__ import annotations

from wire.codec import message
from wire.requests import WorkerLoad


@message
class MemberView:
    """One worker as the router's registry holds it."""

    name: str
    incarnation: str  # the WantedMember's incarnation it was registered under ("" if unknown)
    alive: bool
    draining: bool
    in_flight: int
    load: WorkerLoad | None = None  # its last `load()` answer, if any


@message
class LatencyTotals:
    """The router's cumulative TTFT and TPOT: an autoscaler diffs two readings for a mean."""

    ttft_sum_s: float = 0.0
    ttft_count: float = 0.0
    tpot_sum_s: float = 0.0
    tpot_count: float = 0.0

    def as_dict(self) -> dict[str, tuple[float, float]]:
        return {"ttft": (self.ttft_sum_s, self.ttft_count), "tpot": (self.tpot_sum_s, self.tpot_count)}

    @classmethod
    def from_dict(cls, totals: dict[str, tuple[float, float]]) -> "LatencyTotals":
        ttft, tpot = totals.get("ttft", (0.0, 0.0)), totals.get("tpot", (0.0, 0.0))
        return cls(float(ttft[0]), float(ttft[1]), float(tpot[0]), float(tpot[1]))


@message
class MembershipReport:
    """The router's registry now, and the version of the wanted membership it last applied."""

    known_version: int
    members: tuple[MemberView, ...]
    latency: LatencyTotals = LatencyTotals()


@message
class WantedMember:
    """One worker the router should hold: how to reach its rank 0, and whether it is draining."""

    name: str
    role: str  # "prefill" | "decode"
    incarnation: str  # rank 0's Ray actor id: a worker restarted under its name gets a new one
    control_address: str  # rank 0's control socket
    draining: bool = False
    sender_key: str = ""  # the public key its token deltas carry ("" unauthenticated): the router admits it


@message
class WantedMembership:
    version: int  # bumped by the controller on every change
    members: tuple[WantedMember, ...]
