"""What the router knows of one worker: its last reported load plus what it has dispatched since.

The router owns every `WorkerState` and mutates it from its event loop only.
Load is counted at dispatch: `in_flight` goes up when the router sends a
request and down when that worker's part of it ends (prefill: first token or
failure; decode: the finished delta), so two requests routed in the same
millisecond see each other even before the worker reports a new `WorkerLoad`.

Health, as the registry judges it (`router.registry`): `alive` goes False once,
for good, on a verdict of `liveness` (heartbeats) or when unregistered;
`suspect` is set by a call that failed (dispatch or heartbeat) and cleared by
the next heartbeat answered: a suspect worker gets new requests only when its
pool has no other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from router.ttft_prediction import PromptRate
from wire.liveness import Liveness
from wire.requests import WorkerLoad

Role = Literal["prefill", "decode"]


@dataclass
class WorkerState:
    name: str
    role: Role
    endpoint: object = None  # how the router calls it (opaque to policies)
    load: WorkerLoad | None = None  # last load the worker reported
    in_flight: int = 0  # dispatched and not yet ended, counted by the router
    alive: bool = True
    draining: bool = False  # finishing what it holds; gets no new requests (the cluster removes it next)
    suspect: bool = False  # a call to it failed since its last answered heartbeat
    liveness: Liveness = field(default_factory=Liveness)  # its heartbeat record (the registry's policy)
    # Prompt tokens the dispatcher sent it to compute whose first token has not come (router.ttft_prediction),
    # and its measured prompt rate (from its load reports).
    prompt_tokens_queued: int = 0
    prompt_rate: PromptRate = field(default_factory=PromptRate)
    sender_key: str = ""  # the public key its token deltas carry (wire.socket_security; "": unauthenticated)

    @property
    def pending(self) -> int:
        """Requests this worker has yet to finish, as far as the router can tell."""
        reported = self.load.waiting + self.load.running if self.load is not None else 0
        return max(self.in_flight, reported)

    @property
    def free_blocks(self) -> int:
        return self.load.free_blocks if self.load is not None else 0
