"""Prefill side of the connector: a DEALER per receiver, source blocks held under leases."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch
import zmq

from kvtransfer.codec import DecodeError
from kvtransfer.connector import KVSenderBase, PeerTarget, TransferEvent, TransferTimeouts
from kvtransfer.dist_transport import SENDER_RANK, DistPair, join_store
from kvtransfer.faults import HeldChunks, TransportFaults
from kvtransfer.frames import Run, as_bytes, block_runs, frame_nbytes, gather_runs, run_tensor
from kvtransfer.lease import Clock, LeaseTable
from kvtransfer.protocol import (
    PROTOCOL_VERSION,
    Abort,
    Heartbeat,
    Hello,
    IncompatiblePeerError,
    KVChunk,
    KVSpec,
    Refused,
    TransferDone,
    Welcome,
    compat_hash,
)
from kvtransfer.socket_security import refuse
from kvtransfer.zmq_transport import connect_dealer, decode_header, recv_parts, send_message

logger = logging.getLogger("tandem.kvtransfer")

# Runs shorter than this on average are gathered into one frame per chunk: below it the
# work per frame (Python, syscalls) costs more than one extra copy of the bytes.
GATHER_BELOW_BYTES = 256 * 1024
# Bytes of K + V per ZMQ message (whole runs; a longer run goes alone). See `_send_chunk`.
MESSAGE_BYTES = 1024 * 1024


@dataclass
class _Link:
    address: str
    sock: zmq.Socket
    last_seen: float
    pair: DistPair | None = None
    next_tag: int = 1
    in_flight: list = field(default_factory=list)  # futures of pair sends not yet complete


@dataclass(frozen=True)
class _Transfer:
    target: PeerTarget
    src_block_ids: tuple[int, ...]
    all_runs: tuple[Run, ...]

    def runs(self, positions: range | None) -> tuple[Run, ...]:
        if positions is None:
            return self.all_runs
        src = self.src_block_ids[positions.start : positions.stop]
        return tuple(block_runs(src, self.target.block_ids[positions.start : positions.stop]))


class KVSender(KVSenderBase):
    """Sends this rank's KV blocks, layer by layer; see `kvtransfer.connector` for ownership."""

    def __init__(
        self,
        spec: KVSpec,
        name: str,
        tp_size: int = 1,
        tp_rank: int = 0,
        data_plane: str = "zmq",
        timeouts: TransferTimeouts = TransferTimeouts(),
        clock: Clock = time.monotonic,
        gather_below_bytes: int = GATHER_BELOW_BYTES,
        message_bytes: int = MESSAGE_BYTES,
        faults: TransportFaults = TransportFaults(),
    ):
        self.spec, self.name, self.tp_size, self.tp_rank = spec, name, tp_size, tp_rank
        self.gather_below_bytes, self.message_bytes = gather_below_bytes, message_bytes
        self.data_plane, self.timeouts, self.clock = data_plane, timeouts, clock
        self._ctx = zmq.Context.instance()
        self._links: dict[str, _Link] = {}
        self._transfers: dict[str, dict[str, _Transfer]] = {}  # request id -> address -> transfer
        self._leases = LeaseTable(timeouts.lease_s, clock)
        self._events: list[TransferEvent] = []
        self._next_heartbeat = 0.0
        self._faulty = HeldChunks(faults) if faults.active else None  # tests only

    def send(self, request_id: str, block_ids, peer: PeerTarget) -> None:
        if peer.address in self._transfers.get(request_id, {}):
            raise ValueError(f"request {request_id} already sends to {peer.address}")
        self._link(peer.address)
        src = tuple(int(b) for b in block_ids)
        transfer = _Transfer(peer, src, tuple(block_runs(src, peer.block_ids)))
        self._transfers.setdefault(request_id, {})[peer.address] = transfer
        self._leases.grant((request_id, peer.address))

    def send_layer(
        self, request_id: str, layer: int, k_cache: torch.Tensor, v_cache: torch.Tensor, positions: range | None = None
    ) -> None:
        for address, transfer in list(self._transfers.get(request_id, {}).items()):
            runs = transfer.runs(positions)
            if not runs:
                continue
            try:
                self._send_chunk(request_id, layer, k_cache, v_cache, self._links[address], transfer.target, runs)
            except zmq.Again:
                self._end(request_id, address, "failed", "receiver is not taking data (send timed out)")

    def abort(self, request_id: str, reason: str = "aborted by sender") -> None:
        for address in list(self._transfers.get(request_id, {})):
            self._tell(address, Abort(request_id, reason))
            self._forget(request_id, address)

    def poll(self, timeout_ms: int = 0) -> list[TransferEvent]:
        poller = zmq.Poller()
        for link in self._links.values():
            poller.register(link.sock, zmq.POLLIN)
        if not self._links:
            time.sleep(timeout_ms / 1000)  # an empty poller would return at once
        for sock, _ in poller.poll(timeout_ms) if self._links else ():
            link = next(link for link in self._links.values() if link.sock is sock)
            while link.sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                self._handle(link, recv_parts(link.sock))
        self._tick()
        events, self._events = self._events, []
        return events

    def pending(self) -> list[tuple[str, str]]:
        return [(r, a) for r, by_peer in self._transfers.items() for a in by_peer]

    def close(self) -> None:
        for link in self._links.values():
            link.sock.close(linger=0)
            if link.pair is not None:
                link.pair.close()
        self._links.clear()

    # -- connection --

    def _link(self, address: str) -> _Link:
        if address not in self._links:
            self._links[address] = self._handshake(address)
        return self._links[address]

    def _handshake(self, address: str) -> _Link:
        sock = connect_dealer(self._ctx, address, send_timeout_ms=int(self.timeouts.lease_s * 1000))
        hello = Hello(PROTOCOL_VERSION, compat_hash(self.spec), self.spec, self.tp_size, self.tp_rank, self.name,
                      self.data_plane)  # fmt: skip
        send_message(sock, hello)
        if not sock.poll(int(self.timeouts.handshake_s * 1000)):
            sock.close(linger=0)
            raise ConnectionError(f"KV receiver at {address} did not answer the handshake")
        reply = decode_header(recv_parts(sock)[0], (Welcome, Refused))
        if isinstance(reply, Refused):
            sock.close(linger=0)
            raise IncompatiblePeerError(f"KV receiver at {address} refused us: {reply.reason}")
        link = _Link(address, sock, self.clock())
        if self.data_plane != "zmq":
            store = join_store(reply.dist_store, self.timeouts.handshake_s)
            link.pair = DistPair(store, reply.dist_pair_id, SENDER_RANK, self.data_plane, self.timeouts.handshake_s)
        return link

    # -- data --

    def _send_chunk(self, request_id, layer, k_cache, v_cache, link: _Link, target: PeerTarget, runs) -> None:
        num_heads = target.num_heads or k_cache.shape[2]
        to_host = link.pair is None
        mean_run_bytes = frame_nbytes(k_cache, sum(r.length for r in runs), num_heads) / len(runs)
        gathered = len(runs) > 1 and mean_run_bytes < self.gather_below_bytes
        if gathered:
            tensors = [gather_runs(c, runs, target.src_head_start, num_heads, to_host) for c in (k_cache, v_cache)]
        else:
            tensors = [
                run_tensor(cache, run, target.src_head_start, num_heads, to_host)
                for run in runs
                for cache in (k_cache, v_cache)
            ]  # each [run length, block_size, num_heads, head_dim]
        dst_runs = tuple((run.dst_start, run.length) for run in runs)
        if link.pair is None:
            # Zero-copy runs go out a few per message: the receiver gets a message only once all
            # of it has arrived, so smaller messages let it copy each into the cache while the
            # bytes are still in its CPU cache and while the next message is on the wire.
            per_message = len(dst_runs) if gathered else self._runs_per_message(tensors)
            for first in range(0, len(dst_runs), per_message):
                part = dst_runs[first : first + per_message]
                chunk = KVChunk(request_id, layer, part, target.dst_head_start, num_heads, gathered)
                frames = tensors[2 * first : 2 * (first + len(part))]  # gathered: the 2 frames, K and V
                self._put_on_wire(link, chunk, [as_bytes(t) for t in frames])
        else:
            tag, link.next_tag = link.next_tag, link.next_tag + 1
            chunk = KVChunk(request_id, layer, dst_runs, target.dst_head_start, num_heads, gathered, tag)
            send_message(link.sock, chunk)
            link.in_flight.append(link.pair.send(tensors, tag))

    def _put_on_wire(self, link: _Link, chunk: KVChunk, frames: list) -> None:
        if self._faulty is None:
            send_message(link.sock, chunk, frames)
        else:
            self._faulty.offer(lambda: self._tell(link.address, chunk, frames))

    def _runs_per_message(self, tensors) -> int:
        """Runs (K + V frames each) per ZMQ message so that a message holds about `message_bytes`."""
        run_bytes = max(1, sum(t.nbytes for t in tensors) // (len(tensors) // 2))
        return max(1, self.message_bytes // run_bytes)

    # -- incoming messages and timers --

    def _handle(self, link: _Link, parts) -> None:
        try:
            msg = decode_header(parts[0], (Heartbeat, TransferDone, Abort))
        except DecodeError as e:
            refuse("kv", e.reason, f"from KV receiver {link.address}: {e}")
            return
        link.last_seen = self.clock()
        if isinstance(msg, Heartbeat):
            for request_id in msg.request_ids:
                self._leases.renew((request_id, link.address))
        elif isinstance(msg, TransferDone):
            self._end(msg.request_id, link.address, "done")
        else:
            self._end(msg.request_id, link.address, "failed", f"receiver aborted: {msg.reason}")

    def _tick(self) -> None:
        now = self.clock()
        if self._faulty is not None:
            self._faulty.release_due()
        for link in self._links.values():
            link.in_flight = [sent for sent in link.in_flight if not sent.done()]
        if now >= self._next_heartbeat:
            for address in list(self._links):
                held = tuple(r for r, by_peer in self._transfers.items() if address in by_peer)
                self._tell(address, Heartbeat(held))
            self._next_heartbeat = now + self.timeouts.heartbeat_interval_s
        for request_id, address in self._leases.pop_expired():
            self._end(request_id, address, "expired", f"no heartbeat from {address} for {self.timeouts.lease_s}s")
        for address, link in list(self._links.items()):
            if now - link.last_seen > self.timeouts.peer_silence_s and not any(
                address in by_peer for by_peer in self._transfers.values()
            ):
                # Closing with linger 0 drops queued frames, and with them ZMQ's references to our blocks.
                link.sock.close(linger=0)
                del self._links[address]

    def _end(self, request_id: str, address: str, kind: str, reason: str = "") -> None:
        if address in self._transfers.get(request_id, {}):
            self._forget(request_id, address)
            self._events.append(TransferEvent(request_id, kind, address, reason))

    def _forget(self, request_id: str, address: str) -> None:
        del self._transfers[request_id][address]
        if not self._transfers[request_id]:
            del self._transfers[request_id]
        self._leases.release((request_id, address))

    def _tell(self, address: str, msg, frames=()) -> None:
        link = self._links.get(address)
        if link is not None:
            try:
                send_message(link.sock, msg, frames)
            except zmq.Again:
                pass  # queue full towards a silent peer; its lease will expire
