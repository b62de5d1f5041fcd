"""Prefill side of the connector: a DEALER per receiver, source blocks held under leases.

Nothing here blocks: `send` opens the link and returns (the handshake completes
in a later `poll`, `kvtransfer.sender_link`), `send_layer` queues its frames
(or, before the handshake, the call itself), and a refusal or a silent receiver
ends the transfer with a `failed` event. One thread drives it (its I/O thread).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch
import zmq

from wire.codec import DecodeError
from kvtransfer.connector import KVSenderBase, PeerTarget, TransferEvent, TransferTimeouts
from kvtransfer.faults import HeldChunks, TransportFaults
from kvtransfer.frames import Run, as_bytes, block_runs, frame_nbytes, gather_runs, run_tensor
from kvtransfer.lease import Clock, LeaseTable
from wire.kv import Abort, Heartbeat, KVChunk, KVSpec, Refused, TransferDone, Welcome
from kvtransfer.sender_link import SenderLink, hello_for
from wire.socket_security import refuse
from kvtransfer.zmq_transport import decode_header, recv_parts, send_message

logger = logging.getLogger("tandem.kvtransfer")

# Runs shorter than this on average are gathered into one frame per chunk: below it the
# work per frame (Python, syscalls) costs more than one extra copy of the bytes.
GATHER_BELOW_BYTES = 256 * 1024
# Bytes of K + V per ZMQ message (whole runs; a longer run goes alone). See `_send_chunk`.
MESSAGE_BYTES = 1024 * 1024


@dataclass(frozen=True)
class _Transfer:
    target: PeerTarget
    src_block_ids: tuple[int, ...]
    all_runs: tuple[Run, ...]
    problem: str = ""  # why it cannot run (blocks that do not pair up), told once the handshake did not say

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
        self._links: dict[str, SenderLink] = {}
        self._transfers: dict[str, dict[str, _Transfer]] = {}  # request id -> address -> transfer
        self._leases = LeaseTable(timeouts.lease_s, clock)
        self._events: list[TransferEvent] = []
        self._next_heartbeat = 0.0
        self._faulty = HeldChunks(faults) if faults.active else None  # tests only

    def send(self, request_id: str, block_ids, peer: PeerTarget) -> None:
        if peer.address in self._transfers.get(request_id, {}):
            raise ValueError(f"request {request_id} already sends to {peer.address}")
        link = self._link(peer.address)
        src = tuple(int(b) for b in block_ids)
        try:
            transfer = _Transfer(peer, src, tuple(block_runs(src, peer.block_ids)))
        except ValueError as err:
            if link.ready:
                raise
            # Before the handshake: a block size mismatch also pairs blocks wrongly, and the
            # receiver's refusal says so more clearly. Otherwise this fails it once welcomed.
            transfer = _Transfer(peer, src, (), problem=str(err))
        self._transfers.setdefault(request_id, {})[peer.address] = transfer
        if link.ready:  # else the lease starts with the handshake: the receiver's heartbeats follow it
            self._leases.grant((request_id, peer.address))

    def send_layer(
        self, request_id: str, layer: int, k_cache: torch.Tensor, v_cache: torch.Tensor, positions: range | None = None
    ) -> None:
        for address, transfer in list(self._transfers.get(request_id, {}).items()):
            link = self._links[address]
            if not link.ready:
                link.deferred.append((request_id, layer, k_cache, v_cache, positions))
                continue
            runs = transfer.runs(positions)
            if not runs:
                continue
            try:
                self._send_chunk(request_id, layer, k_cache, v_cache, link, transfer.target, runs)
            except zmq.Again:  # the link's queue cannot take it: the receiver is gone or stuck
                self._end(request_id, address, "failed", "receiver is not taking data")

    def abort(self, request_id: str, reason: str = "aborted by sender") -> None:
        for address, transfer in list(self._transfers.get(request_id, {}).items()):
            self._tell(address, Abort(request_id, reason, transfer.target.transfer_token))
            self._forget(request_id, address)

    def poll(self, timeout_ms: int = 0) -> list[TransferEvent]:
        poller = zmq.Poller()
        for link in self._links.values():
            poller.register(link.sock, zmq.POLLIN)
        if not self._links:
            time.sleep(timeout_ms / 1000)  # an empty poller would return at once
        for sock, _ in poller.poll(timeout_ms) if self._links else ():
            link = next(link for link in self._links.values() if link.sock is sock)
            while self._links.get(link.address) is link and link.sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                self._handle(link, recv_parts(link.sock))
        self._tick()
        events, self._events = self._events, []
        return events

    def sockets(self) -> list[zmq.Socket]:
        """What to wait on besides `next_deadline` (an I/O thread's poller)."""
        return [link.sock for link in self._links.values()]

    def next_deadline(self) -> float | None:
        """When `poll` has timer work (heartbeats, leases, handshakes) with nothing to read; None: idle."""
        return self._next_heartbeat if self._links else None

    def pending(self) -> list[tuple[str, str]]:
        return [(r, a) for r, by_peer in self._transfers.items() for a in by_peer]

    def close(self) -> None:
        for link in self._links.values():
            link.close()
        self._links.clear()

    # -- connection --

    def _link(self, address: str) -> SenderLink:
        link = self._links.get(address)
        if link is None:
            hello = hello_for(self.spec, self.tp_size, self.tp_rank, self.name, self.data_plane)
            link = self._links[address] = SenderLink.open(self._ctx, address, hello, self.clock())
        return link

    def _on_handshake(self, link: SenderLink, reply: Welcome | Refused) -> None:
        link.on_handshake(reply, self.data_plane, self.timeouts.handshake_s)
        if link.state == "refused":
            self._drop_link(link)
            return
        for request_id, by_peer in list(self._transfers.items()):
            transfer = by_peer.get(link.address)
            if transfer is not None and transfer.problem:
                self._end(request_id, link.address, "failed", transfer.problem)
            elif transfer is not None:
                self._leases.grant((request_id, link.address))
        deferred, link.deferred = link.deferred, []
        for request_id, layer, k_cache, v_cache, positions in deferred:
            self.send_layer(request_id, layer, k_cache, v_cache, positions)

    def _drop_link(self, link: SenderLink) -> None:
        """A refused (or silent) receiver: every transfer to it fails, the link goes."""
        for request_id in [r for r, by_peer in self._transfers.items() if link.address in by_peer]:
            self._end(request_id, link.address, "failed", link.refusal)
        link.close()
        del self._links[link.address]

    # -- data --

    def _send_chunk(self, request_id, layer, k_cache, v_cache, link: SenderLink, target: PeerTarget, runs) -> None:
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
                chunk = KVChunk(request_id, layer, part, target.dst_head_start, num_heads, gathered,
                                transfer_token=target.transfer_token)  # fmt: skip
                frames = tensors[2 * first : 2 * (first + len(part))]  # gathered: the 2 frames, K and V
                self._put_on_wire(link, chunk, [as_bytes(t) for t in frames])
        else:
            tag, link.next_tag = link.next_tag, link.next_tag + 1
            chunk = KVChunk(request_id, layer, dst_runs, target.dst_head_start, num_heads, gathered, tag,
                            target.transfer_token)  # fmt: skip
            send_message(link.sock, chunk)
            link.in_flight.append(link.pair.send(tensors, tag))

    def _put_on_wire(self, link: SenderLink, chunk: KVChunk, frames: list) -> None:
        if self._faulty is None:
            send_message(link.sock, chunk, frames)
        else:
            self._faulty.offer(lambda: self._tell(link.address, chunk, frames))

    def _runs_per_message(self, tensors) -> int:
        """Runs (K + V frames each) per ZMQ message so that a message holds about `message_bytes`."""
        run_bytes = max(1, sum(t.nbytes for t in tensors) // (len(tensors) // 2))
        return max(1, self.message_bytes // run_bytes)

    # -- incoming messages and timers --

    def _handle(self, link: SenderLink, parts) -> None:
        try:
            msg = decode_header(parts[0], (Heartbeat, TransferDone, Abort, Welcome, Refused))
        except DecodeError as e:
            refuse("kv", e.reason, f"from KV receiver {link.address}: {e}")
            return
        link.last_seen = self.clock()
        if isinstance(msg, (Welcome, Refused)):
            self._on_handshake(link, msg)
        elif isinstance(msg, Heartbeat):
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
        for link in list(self._links.values()):
            link.in_flight = [sent for sent in link.in_flight if not sent.done()]
            link.check_handshake(now, self.timeouts.handshake_s)
            if link.state == "refused":
                self._drop_link(link)
        if now >= self._next_heartbeat:
            for address, link in self._links.items():
                if link.ready:
                    held = tuple(r for r, by_peer in self._transfers.items() if address in by_peer)
                    self._tell(address, Heartbeat(held))
            self._next_heartbeat = now + self.timeouts.heartbeat_interval_s
        for request_id, address in self._leases.pop_expired():
            self._end(request_id, address, "expired", f"no heartbeat from {address} for {self.timeouts.lease_s}s")
        for address, link in list(self._links.items()):
            if link.ready and now - link.last_seen > self.timeouts.peer_silence_s and not any(
                address in by_peer for by_peer in self._transfers.values()
            ):
                link.close()
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
