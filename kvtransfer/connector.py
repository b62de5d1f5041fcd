"""The KV connector seam: what the prefill and decode workers call, whatever the transport.

    decode worker                                   prefill worker
    blocks = pool.allocate(n)       (owns them)
    receiver.recv(req, ids) ─── ids via control plane ──► sender.send(req, src_ids, target)
                                                          for each layer as computed:
                                                              sender.send_layer(req, layer, k, v)
    receiver.poll() ─► TransferEvent(done|failed)         sender.poll() ─► TransferEvent(done|failed|expired)

Ownership:
- The caller owns the blocks on both sides: `BlockPool.allocate` / `free` stay
  with the worker. The connector never frees a block; it says when it is safe.
- Sender: from `send()` until that (request, peer) reports an event, the source
  blocks must stay allocated and unmodified (ZMQ reads them in place, without
  copies). Any event (`done`, `failed`, `expired`) ends the transfer: free then.
  `expired` means the receiver's heartbeats stopped renewing the lease (the
  link to a silent receiver is then closed, dropping its queued frames). After
  `failed` or `expired`, frames still queued towards a live receiver may yet be
  read from the freed blocks; the receiver drops chunks of requests it no
  longer holds, so reusing those blocks cannot corrupt anyone's cache.
- Receiver: from `recv()` until that request reports `done` or `failed`, the
  reserved blocks must not be reused. Writes happen only inside `poll()`, so
  after `failed` (or after `abort()` returns) no write into them is in flight.
  After `done` the blocks hold the request's KV and belong to the request.
- Exactly one terminal event per request on the receiver, per (request, peer)
  on the sender. Callers must call `poll()` at least every heartbeat interval.
- A request id names one transfer attempt: a retry needs a new id (late chunks
  of a failed attempt would otherwise count towards the retry).
- Neither side is thread-safe: one thread drives each (ZMQ sockets are not shareable).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from kvtransfer.resharding import Piece

if TYPE_CHECKING:
    import torch

EventKind = Literal["done", "failed", "expired"]


@dataclass(frozen=True)
class TransferEvent:
    request_id: str
    kind: EventKind
    peer: str = ""  # the receiver's address (sender side) or the sender's name (receiver side)
    reason: str = ""


@dataclass(frozen=True)
class PeerTarget:
    """Where one decode rank wants a request's KV: its address, reserved block ids, head placement."""

    address: str
    block_ids: tuple[int, ...]
    src_head_start: int = 0  # first head of the sender's shard to send
    dst_head_start: int = 0  # where it lands in the receiver's shard
    num_heads: int | None = None  # None: all of the sender's heads
    transfer_token: str = field(default="", repr=False)  # the reservation's: every chunk and Abort carries it

    @classmethod
    def from_piece(cls, piece: Piece, address: str, block_ids, transfer_token: str = "") -> "PeerTarget":
        """The target for one `resharding.Piece` of a prefill TP=a to decode TP=b plan."""
        return cls(address, tuple(block_ids), piece.src_head_start, piece.dst_head_start, piece.num_heads,
                   transfer_token)  # fmt: skip


@dataclass(frozen=True)
class TransferTimeouts:
    heartbeat_interval_s: float = 0.5
    lease_s: float = 5.0  # sender: blocks held this long past the last receiver heartbeat
    peer_silence_s: float = 5.0  # receiver: a sender silent this long is gone
    transfer_s: float = 120.0  # receiver: whole-request deadline from recv()
    handshake_s: float = 10.0


class KVSenderBase(abc.ABC):
    """Prefill side."""

    @abc.abstractmethod
    def send(self, request_id: str, block_ids, peer: PeerTarget) -> None:
        """Start moving `block_ids` (ours, in order) into `peer.block_ids`; connects on first use.

        Raises `IncompatiblePeerError` if the peer refuses the handshake."""

    @abc.abstractmethod
    def send_layer(
        self, request_id: str, layer: int, k_cache: torch.Tensor, v_cache: torch.Tensor, positions: range | None = None
    ) -> None:
        """Ship one layer's K/V of the request's blocks to every peer of the request; returns without waiting.

        `positions` picks which of the request's blocks (indices into `block_ids`) this
        call sends, so chunked prefill can send each chunk's full blocks as they are
        computed; None sends them all. The receiver is done once every layer of every
        block has arrived, in any order."""

    @abc.abstractmethod
    def abort(self, request_id: str, reason: str = "aborted by sender") -> None:
        """Tell the peers; no event follows. Source blocks may be freed on return."""

    @abc.abstractmethod
    def poll(self, timeout_ms: int = 0) -> list[TransferEvent]:
        """Handle replies and heartbeats, expire leases; return the transfers that ended."""


class KVReceiverBase(abc.ABC):
    """Decode side."""

    address: str

    @abc.abstractmethod
    def recv(self, request_id: str, block_ids, transfer_token: str = "") -> None:
        """Expect the request's KV (every layer, all our heads) into these reserved block ids; with a
        `transfer_token`, only chunks (and a sender's Abort) carrying it count."""

    @abc.abstractmethod
    def abort(self, request_id: str, reason: str = "aborted by receiver") -> None:
        """Tell the senders; no event follows. The reserved blocks may be reused on return."""

    @abc.abstractmethod
    def poll(self, timeout_ms: int = 0) -> list[TransferEvent]:
        """Receive and write chunks, heartbeat, detect dead senders; return requests that ended."""
