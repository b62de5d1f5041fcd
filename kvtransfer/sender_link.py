"""One KV sender's connection to one receiver: a DEALER whose handshake never blocks its thread.

    connecting ── Hello sent ──► Welcome ──► ready (layers go out; heartbeats renew leases)
        │                   └──► Refused ──► refused (every transfer to it fails, the reason says why)
        └── no answer within handshake_s ──► refused ("did not answer the handshake")

While connecting, the layers a transfer is asked to send wait in the link
(`deferred`) and go out in order once it is ready; the source blocks stay held
by the caller meanwhile, as for any transfer in flight (`kvtransfer.connector`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import zmq

from kvtransfer.dist_transport import SENDER_RANK, DistPair, join_store
from wire.kv import PROTOCOL_VERSION, Hello, KVSpec, Refused, Welcome, compat_hash
from kvtransfer.zmq_transport import connect_dealer, send_message


@dataclass
class SenderLink:
    address: str
    sock: zmq.Socket
    opened_at: float  # sender clock: when Hello went out
    last_seen: float
    state: str = "connecting"  # "connecting" | "ready" | "refused"
    refusal: str = ""
    pair: object | None = None  # a DistPair once ready, for the gloo/NCCL data plane
    next_tag: int = 1
    in_flight: list = field(default_factory=list)  # futures of pair sends not yet complete
    deferred: list = field(default_factory=list)  # (request_id, send_layer args) waiting for the handshake

    @classmethod
    def open(cls, ctx: zmq.Context, address: str, hello: Hello, now: float) -> "SenderLink":
        # Sends never block (unbounded queue): what is in flight is bounded by the blocks held for it.
        sock = connect_dealer(ctx, address, send_timeout_ms=0)
        send_message(sock, hello)
        return cls(address, sock, now, now)

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    def on_handshake(self, reply: Welcome | Refused, data_plane: str, handshake_s: float) -> None:
        """The receiver's answer to our Hello (a late or repeated one is ignored)."""
        if self.state != "connecting":
            return
        if isinstance(reply, Refused):
            self.state, self.refusal = "refused", f"KV receiver at {self.address} refused us: {reply.reason}"
            return
        if data_plane != "zmq":
            # The pair's rendezvous needs both sides at once; the receiver entered it before it welcomed us.
            # It blocks this thread for the rendezvous only (milliseconds when both sides are up).
            try:
                store = join_store(reply.dist_store, handshake_s)
                self.pair = DistPair(store, reply.dist_pair_id, SENDER_RANK, data_plane, handshake_s)
            except RuntimeError as err:
                self.state, self.refusal = "refused", f"{data_plane} pair with {self.address} failed: {err}"
                return
        self.state = "ready"

    def check_handshake(self, now: float, handshake_s: float) -> None:
        if self.state == "connecting" and now - self.opened_at > handshake_s:
            self.state, self.refusal = "refused", f"KV receiver at {self.address} did not answer the handshake"

    def close(self) -> None:
        # Linger 0 drops queued frames, and with them ZMQ's references to our blocks.
        self.sock.close(linger=0)
        if self.pair is not None:
            self.pair.close()


def hello_for(spec: KVSpec, tp_size: int, tp_rank: int, name: str, data_plane: str) -> Hello:
    return Hello(PROTOCOL_VERSION, compat_hash(spec), spec, tp_size, tp_rank, name, data_plane)
