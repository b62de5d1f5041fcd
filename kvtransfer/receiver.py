"""Decode side of the connector: one ROUTER socket, reserved blocks filled chunk by chunk."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch
import zmq

from wire.codec import DecodeError
from kvtransfer.connector import KVReceiverBase, TransferEvent, TransferTimeouts
from kvtransfer.dist_transport import RECEIVER_RANK, DistPair, host_store
from kvtransfer.frames import FrameError, check_frame, frame_nbytes, scatter_runs, write_run
from kvtransfer.lease import Clock
from kvtransfer.handshake import IncompatiblePeerError, check_hello
from wire.kv import PROTOCOL_VERSION, Abort, Heartbeat, Hello, KVChunk, KVSpec, Refused, TransferDone, Welcome
from kvtransfer.reservation import Reservation
from wire.socket_security import SMALL_MESSAGE_BYTES, refuse
from kvtransfer.zmq_transport import bind_router, decode_header, recv_parts, send_message

logger = logging.getLogger("tandem.kvtransfer")

_MAX_MESSAGES_PER_POLL = 256


@dataclass
class ReceiverStats:
    rejected_chunks: int = 0  # malformed, truncated or from an unwelcome sender: counted, never written
    refused_peers: int = 0
    dropped_chunks: int = 0  # for requests no longer expected (aborted, failed, done)
    bytes_written: int = 0
    chunks_written: int = 0  # messages landed in the cache
    # Completed transfers: how many, their bytes, and the time from each one's first landed chunk to its last.
    transfers_completed: int = 0
    transfer_bytes: int = 0
    transfer_seconds: float = 0.0


@dataclass
class _Sender:
    name: str
    last_seen: float
    pair: DistPair | None = None
    # Its pair's group being built on a thread of its own (gloo/NCCL: blocks until both ranks have joined,
    # up to the handshake timeout); None once built, or on the ZMQ data plane.
    joining: Future | None = None
    # Headers of chunks that came before the pair was built, oldest first: their receives are posted then.
    unposted: deque = field(default_factory=deque)
    # Chunks whose frames are still arriving over the pair, oldest first: (header, staging, future).
    in_flight: deque = field(default_factory=deque)

    @property
    def over_pair(self) -> bool:
        """Its tensor frames come over a torch.distributed pair (built or being built), not inline."""
        return self.pair is not None or self.joining is not None

    @property
    def waiting(self) -> bool:
        """Pair work with nothing to wake the ZMQ socket: a group being built, receives in flight."""
        return self.joining is not None or bool(self.in_flight)


class KVReceiver(KVReceiverBase):
    """Writes incoming KV into `kv_caches` (one (K, V) pair per layer, this rank's heads).

    See `kvtransfer.connector` for who owns the reserved blocks when.
    """

    def __init__(
        self,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        spec: KVSpec,
        address: str = "tcp://127.0.0.1:0",
        tp_size: int = 1,
        tp_rank: int = 0,
        dist_backend: str = "gloo",
        timeouts: TransferTimeouts = TransferTimeouts(),
        clock: Clock = time.monotonic,
    ):
        if len(kv_caches) != spec.num_layers:
            raise ValueError(f"{len(kv_caches)} cache layers for a spec of {spec.num_layers}")
        self.kv_caches, self.spec, self.tp_size, self.tp_rank = kv_caches, spec, tp_size, tp_rank
        self.local_heads = kv_caches[0][0].shape[2]
        self.dist_backend, self.timeouts, self.clock = dist_backend, timeouts, clock
        self.stats = ReceiverStats()
        self._ctx = zmq.Context.instance()
        # The largest legitimate frame is one layer's K (or V) run: at most that layer's whole cache.
        max_frame = max(SMALL_MESSAGE_BYTES, *(k.nbytes for k, _ in kv_caches))
        self._sock, self.address = bind_router(self._ctx, address, max_frame)
        self._senders: dict[bytes, _Sender] = {}
        self._reservations: dict[str, Reservation] = {}
        self._store = None
        self._store_address = ""
        self._pairs_made = 0
        self._next_heartbeat = 0.0

    def recv(self, request_id: str, block_ids, transfer_token: str = "") -> None:
        if request_id in self._reservations:
            raise ValueError(f"request {request_id} already has a reservation")
        deadline = self.clock() + self.timeouts.transfer_s
        self._reservations[request_id] = Reservation.create(block_ids, self.spec.num_layers, self.local_heads,
                                                            deadline, transfer_token)  # fmt: skip

    def abort(self, request_id: str, reason: str = "aborted by receiver") -> None:
        res = self._reservations.pop(request_id, None)
        if res is not None:
            self._tell(res.contributors or self._senders, Abort(request_id, reason))

    def poll(self, timeout_ms: int = 0) -> list[TransferEvent]:
        events: list[TransferEvent] = []
        if any(sender.waiting for sender in self._senders.values()):
            timeout_ms = min(timeout_ms, 1)  # pairs are built and receives complete without waking the socket
        if self._sock.poll(timeout_ms):
            # Bounded, so heartbeats and deadlines still run under a steady stream of chunks.
            for _ in range(_MAX_MESSAGES_PER_POLL):
                if not self._sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                    break
                self._handle(recv_parts(self._sock), events)
        for identity, sender in list(self._senders.items()):
            if identity in self._senders and sender.joining is not None and sender.joining.done():
                self._joined(identity, sender, events)
            if identity in self._senders:  # landing one sender's chunks may forget another
                self._land_dist_chunks(identity, sender, events)
        self._tick(events)
        return events

    def pending(self) -> list[str]:
        return list(self._reservations)

    def sockets(self) -> list[zmq.Socket]:
        """What to wait on besides `next_deadline` (an I/O thread's poller)."""
        return [self._sock]

    def next_deadline(self) -> float | None:
        """When `poll` has timer work (heartbeats, deadlines, silent senders) with nothing to read; None: idle."""
        if any(sender.waiting for sender in self._senders.values()):
            return self.clock() + 0.001  # pair work completes without waking the ZMQ socket: look again soon
        return self._next_heartbeat if self._senders or self._reservations else None

    def close(self) -> None:
        self._sock.close(linger=0)

    # -- incoming messages --

    def _handle(self, parts: list[zmq.Frame], events: list[TransferEvent]) -> None:
        identity = parts[0].bytes
        try:
            msg = decode_header(parts[1], (Hello, KVChunk, Heartbeat, Abort)) if len(parts) > 1 else None
        except DecodeError as e:
            msg = None
            refuse("kv", e.reason, f"from {self._name(identity)}: {e}")
        if msg is None:
            if len(parts) <= 1:
                refuse("kv", "malformed", f"from {self._name(identity)}: no header")
            self.stats.rejected_chunks += 1
            return
        if isinstance(msg, Hello):
            return self._on_hello(identity, msg)
        sender = self._senders.get(identity)
        if sender is None:  # not welcomed: refused, forgotten, or never said hello
            if isinstance(msg, KVChunk):
                self.stats.rejected_chunks += 1
            return
        sender.last_seen = self.clock()
        if isinstance(msg, KVChunk):
            self._on_chunk(identity, sender, msg, parts[2:], events)
        elif isinstance(msg, Abort) and msg.request_id in self._reservations:
            if not self._reservations[msg.request_id].admits(msg.transfer_token):
                refuse("kv", "wrong_transfer_token", f"an Abort of {msg.request_id} from {sender.name}")
                return
            del self._reservations[msg.request_id]
            events.append(TransferEvent(msg.request_id, "failed", sender.name, f"sender aborted: {msg.reason}"))

    def _on_hello(self, identity: bytes, hello: Hello) -> None:
        try:
            check_hello(hello, self.spec, self.tp_size)
            if hello.data_plane not in ("zmq", self.dist_backend):
                raise IncompatiblePeerError(f"data plane {hello.data_plane!r} not offered (zmq, {self.dist_backend})")
        except (IncompatiblePeerError, ValueError) as e:
            self.stats.refused_peers += 1
            logger.error("refused KV sender %s: %s", hello.sender_name, e)
            send_message(self._sock, Refused(str(e)), identity=identity)
            return
        sender = _Sender(hello.sender_name, self.clock())
        self._pairs_made += 1
        pair_id = self._pairs_made  # never reused: each pair has its own prefix in the store
        if hello.data_plane != "zmq":
            self._ensure_store()
        send_message(
            self._sock,
            Welcome(PROTOCOL_VERSION, self.tp_size, self.tp_rank, self._store_address, pair_id),
            identity=identity,
        )
        if hello.data_plane != "zmq":  # built off this thread: it waits for the sender to join, up to seconds
            sender.joining = _build_pair(self._store, pair_id, self.dist_backend, self.timeouts.handshake_s)
        self._senders[identity] = sender

    def _joined(self, identity: bytes, sender: _Sender, events: list[TransferEvent]) -> None:
        """The sender's pair is built (its receives posted for the chunks that came meanwhile) or failed."""
        joining, sender.joining = sender.joining, None
        try:
            sender.pair = joining.result()
        except RuntimeError as e:  # the sender never joined (died, or cannot reach our store)
            reason = f"sender {sender.name} did not join its {self.dist_backend} pair: {e}"
            logger.error("KV %s", reason)
            self._forget_sender(identity, reason, events)
            return
        sender.last_seen = self.clock()  # it could say nothing while both sides built the group
        while sender.unposted:
            self._post_recv(sender, sender.unposted.popleft())

    def _ensure_store(self) -> None:
        if self._store is None:
            host = self.address.split("//", 1)[1].rsplit(":", 1)[0] if self.address.startswith("tcp") else "127.0.0.1"
            self._store, self._store_address = host_store(host, self.timeouts.handshake_s)

    def _on_chunk(self, identity, sender: _Sender, chunk: KVChunk, frames, events) -> None:
        res = self._reservations.get(chunk.request_id)
        if res is not None and not res.admits(chunk.transfer_token):
            self._refuse_unentitled(identity, sender, chunk, events)
            return
        if res is not None:
            res.contributors.add(identity)  # from now on its silence fails the request
        try:
            self._check_header(chunk, res, frames, sender)
        except FrameError as e:
            self._reject(identity, sender, chunk, e, events)
            return
        if sender.joining is not None:  # its frames come over a pair still being built: posted once it is
            sender.unposted.append(chunk)
        elif sender.pair is None:
            self._land(identity, sender, chunk, frames, events)
        else:
            self._post_recv(sender, chunk)

    def _post_recv(self, sender: _Sender, chunk: KVChunk) -> None:
        k_cache = self.kv_caches[chunk.layer][0]
        sizes = [frame_nbytes(k_cache, length, chunk.num_heads) for length in chunk.frame_blocks()]
        sender.in_flight.append((chunk, *sender.pair.post_recv(sizes, chunk.dist_tag, k_cache.device)))

    def _land_dist_chunks(self, identity: bytes, sender: _Sender, events) -> None:
        """Write the pair chunks whose frames have all arrived, in the order they were sent."""
        while identity in self._senders and sender.in_flight and sender.in_flight[0][2].done():
            chunk, staging, arrived = sender.in_flight.popleft()
            try:
                arrived.result()  # raises if a receive failed
            except RuntimeError as e:
                self._forget_sender(identity, f"sender {sender.name} gone ({self.dist_backend} pair: {e})", events)
                return
            self._land(identity, sender, chunk, staging, events)

    def _land(self, identity: bytes, sender: _Sender, chunk: KVChunk, frames, events) -> None:
        """Check the frames against the header and write them, or reject the chunk; never a partial write."""
        res = self._reservations.get(chunk.request_id)
        if res is None:
            self.stats.dropped_chunks += 1
            return
        try:
            self._check_frames(chunk, frames)
        except FrameError as e:
            self._reject(identity, sender, chunk, e, events)
            return
        self._write(chunk, res, frames)
        if res.complete:
            del self._reservations[chunk.request_id]
            self._count_transfer(res)
            self._tell(res.contributors, TransferDone(chunk.request_id))
            events.append(TransferEvent(chunk.request_id, "done", sender.name))

    def _refuse_unentitled(self, identity: bytes, sender: _Sender, chunk: KVChunk, events) -> None:
        """A chunk for a request it was not given (no or another transfer token): dropped, the request's
        transfer untouched (a bad chunk of its own sender fails it; a stranger's must not)."""
        self.stats.rejected_chunks += 1
        refuse("kv", "wrong_transfer_token", f"a chunk of {chunk.request_id} from {sender.name}")
        if sender.over_pair:  # its pair's byte stream now runs ahead of the headers we took
            self._forget_sender(identity, f"sender {sender.name} sent a chunk it had no token for", events)

    def _reject(self, identity: bytes, sender: _Sender, chunk: KVChunk, error: Exception, events) -> None:
        self.stats.rejected_chunks += 1
        logger.error("rejected a KV chunk of %s from %s: %s", chunk.request_id, sender.name, error)
        if chunk.request_id in self._reservations:
            self._fail(chunk.request_id, f"rejected chunk: {error}", events)
        if sender.pair is not None:
            # The pair's byte stream is out of step with the headers: stop trusting this sender.
            self._forget_sender(identity, f"sender {sender.name} sent a bad chunk", events)

    def _check_header(self, chunk: KVChunk, res: Reservation | None, frames, sender: _Sender) -> None:
        expected_frames = 0 if sender.over_pair else len(chunk.frame_blocks())
        if len(frames) != expected_frames:
            raise FrameError(f"{len(frames)} frames for {len(chunk.dst_runs)} runs (expected {expected_frames})")
        if not 0 <= chunk.layer < self.spec.num_layers:
            raise FrameError(f"layer {chunk.layer} outside 0..{self.spec.num_layers - 1}")
        if chunk.num_heads < 1 or chunk.head_start < 0 or chunk.head_start + chunk.num_heads > self.local_heads:
            raise FrameError(f"heads {chunk.head_start}+{chunk.num_heads} outside our {self.local_heads}")
        num_blocks = self.kv_caches[0][0].shape[0]
        for start, length in chunk.dst_runs:
            if length < 1 or start < 0 or start + length > num_blocks:
                raise FrameError(f"blocks {start}..{start + length - 1} outside our {num_blocks}")
            if res is not None and not res.holds(start, length):
                raise FrameError(f"blocks {start}..{start + length - 1} not reserved for {chunk.request_id}")

    def _check_frames(self, chunk: KVChunk, frames) -> None:
        k_cache = self.kv_caches[chunk.layer][0]
        for frame, length in zip(frames, chunk.frame_blocks()):
            check_frame(_buffer(frame), k_cache, length, chunk.num_heads)

    def _write(self, chunk: KVChunk, res: Reservation, frames) -> None:
        k_cache, v_cache = self.kv_caches[chunk.layer]
        heads = slice(chunk.head_start, chunk.head_start + chunk.num_heads)
        if chunk.gathered:
            for cache, frame in ((k_cache, frames[0]), (v_cache, frames[1])):
                scatter_runs(cache, _buffer(frame), chunk.dst_runs, chunk.head_start, chunk.num_heads)
        for i, (start, length) in enumerate(chunk.dst_runs):
            if not chunk.gathered:
                for cache, frame in ((k_cache, frames[2 * i]), (v_cache, frames[2 * i + 1])):
                    write_run(cache, _buffer(frame), start, length, chunk.head_start, chunk.num_heads)
            res.mark_written(chunk.layer, start, length, heads)
        nbytes = 2 * sum(frame_nbytes(k_cache, n, chunk.num_heads) for _, n in chunk.dst_runs)
        self.stats.chunks_written += 1
        self.stats.bytes_written += nbytes
        res.bytes_written += nbytes
        if res.first_write_at is None:
            res.first_write_at = self.clock()

    def _count_transfer(self, res: Reservation) -> None:
        self.stats.transfers_completed += 1
        self.stats.transfer_bytes += res.bytes_written
        self.stats.transfer_seconds += self.clock() - res.first_write_at

    # -- timers --

    def _tick(self, events: list[TransferEvent]) -> None:
        now = self.clock()
        if now >= self._next_heartbeat:
            self._tell(self._senders, Heartbeat(tuple(self._reservations)))
            self._next_heartbeat = now + self.timeouts.heartbeat_interval_s
        for identity, sender in list(self._senders.items()):
            if sender.joining is None and now - sender.last_seen > self.timeouts.peer_silence_s:
                silent = now - sender.last_seen
                self._forget_sender(identity, f"sender {sender.name} gone (silent {silent:.1f}s)", events)
        for request_id, res in list(self._reservations.items()):
            if now >= res.deadline:
                self._fail(request_id, f"timed out after {self.timeouts.transfer_s}s", events)

    def _forget_sender(self, identity: bytes, reason: str, events: list[TransferEvent]) -> None:
        """Fail every request this sender was filling; its later messages are rejected.

        Receives still posted on its pair land in their staging tensors, never in the cache."""
        for request_id, res in list(self._reservations.items()):
            if identity in res.contributors:
                self._fail(request_id, reason, events)
        sender = self._senders.pop(identity, None)
        if sender is not None and sender.pair is not None:
            sender.pair.close()
        if sender is not None and sender.joining is not None:  # the pair, if it is ever built, is closed then
            sender.joining.add_done_callback(lambda built: built.exception() or built.result().close())

    def _fail(self, request_id: str, reason: str, events: list[TransferEvent]) -> None:
        res = self._reservations.pop(request_id)
        self._tell(res.contributors, Abort(request_id, reason))
        events.append(TransferEvent(request_id, "failed", "", reason))

    def _tell(self, identities, msg) -> None:
        for identity in list(identities):
            if identity in self._senders:
                try:
                    send_message(self._sock, msg, identity=identity)
                except zmq.ZMQError:
                    pass  # the peer is gone; its silence ends its transfers

    def _name(self, identity: bytes) -> str:
        sender = self._senders.get(identity)
        return sender.name if sender else identity.hex()


def _build_pair(store, pair_id: int, backend: str, timeout_s: float) -> Future:
    """A receiver-side `DistPair` built on a daemon thread; the future fails (RuntimeError) if the sender does
    not join within `timeout_s`."""
    future: Future = Future()

    def build() -> None:
        try:
            future.set_result(DistPair(store, pair_id, RECEIVER_RANK, backend, timeout_s))
        except Exception as e:  # noqa: BLE001 - handed to the receiver's loop through the future
            future.set_exception(e if isinstance(e, RuntimeError) else RuntimeError(str(e)))

    threading.Thread(target=build, name=f"tandem-kv-pair-{pair_id}-join", daemon=True).start()
    return future


def _buffer(frame):
    return frame if isinstance(frame, torch.Tensor) else frame.buffer
