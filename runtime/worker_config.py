"""What every worker of either role is configured with: its name, where it binds, how long it waits."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from kvtransfer.connector import TransferTimeouts
from runtime.arrival_window import ArrivalWindowConfig

# `host` value: bind on this node's Ray address (resolved in the actor, on its node), so that a router,
# prefill workers or follower ranks on other machines reach the sockets.
NODE_IP = "node-ip"


@dataclass(frozen=True)
class WorkerConfig:
    name: str
    timeouts: TransferTimeouts = TransferTimeouts()
    # Every socket the worker binds (control, KV receiver, inbox, TP rank links) binds here, on any free port.
    host: str = "127.0.0.1"
    rank_ack_timeout_s: float = 10.0  # tensor parallel: a follower that does not acknowledge is given up on
    router_lease_s: float = 60.0  # no control call for this long: the router is gone, end what we hold
    # An idle engine's first step waits a few ms while a burst of prompts keeps arriving (runtime.arrival_window).
    arrival_window: ArrivalWindowConfig = ArrivalWindowConfig()
    # The cluster's CURVE key ('<public>:<secret>'; "": unauthenticated sockets). The actor installs it
    # before any socket opens (wire.socket_security.use_cluster_key): it travels in the actor's creation
    # arguments, never in Ray's runtime_env.
    cluster_key: str = field(default="", repr=False)
    # The router's sender key, public half: with a cluster key, the control socket admits only it
    # (wire.socket_security), so no other member can reserve, free or redirect this worker's pushes.
    router_key: str = ""
    # The most one structured-output grammar may take to compile (runtime.grammar_child); longer: the request
    # is refused (400) as an invalid grammar would be. The largest ordinary schemas measured here took 8 s.
    grammar_compile_timeout_s: float = 30.0
    # The most grammars compiling or waiting to at once (runtime.grammar_compiles); past it a request with a new
    # grammar is refused as busy (503, Retry-After). One compile thread: 16 waiting is at most ~16 x 2 x timeout.
    max_grammar_compiles_waiting: int = 16
    # Rank r runs on core_sets[r] only (runtime.cpu_pinning; cluster.core_map hands them out); (): unpinned.
    core_sets: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self):
        if self.cluster_key and not self.router_key:
            raise ValueError(f"{self.name}: a cluster key needs the router's key (no one could call the worker)")

    @property
    def bind_address(self) -> str:
        """A ZMQ address on `host`, port 0 (the socket says which port it got)."""
        return f"tcp://{self.host}:0"


def on_this_node(config: WorkerConfig) -> WorkerConfig:
    """`config` with `NODE_IP` resolved to this node's Ray address (asked of Ray only then)."""
    if config.host != NODE_IP:
        return config
    import ray

    return dataclasses.replace(config, host=ray.util.get_node_ip_address())
