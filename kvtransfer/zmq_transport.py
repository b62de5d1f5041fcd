"""ZMQ sockets for the KV data plane: one ROUTER bound by each receiver, one DEALER per (sender, receiver) pair.

A message is a multipart: [msgpack header, raw frame, raw frame, ...] (the
ROUTER side sees the peer's identity first). Tensor frames go out with
`copy=False`: ZMQ keeps a reference to the tensor's memory and reads it from
its I/O thread, so the sender must not overwrite those blocks until the
transfer is over (the lease / TransferDone rules in `kvtransfer.connector`).

Addresses: "tcp://host:port" between hosts, "ipc:///path" on one host.
"""

from __future__ import annotations

import zmq

from wire.codec import decode, encode
from wire.socket_security import bind_secured, connect_secured

# pyzmq copies frames smaller than this anyway; above it, zero-copy is worth the tracking cost.
_ZERO_COPY_MIN_BYTES = 64 * 1024


def bind_router(ctx: zmq.Context, address: str, max_frame_bytes: int) -> tuple[zmq.Socket, str]:
    """Bind a ROUTER at `address` ("tcp://127.0.0.1:0" picks a free port); return it and its real address.

    `max_frame_bytes`: the largest frame a sender may send (a larger one drops its connection).
    Unbounded queues (HWM 0): a dropped KV frame would corrupt a transfer, and what is
    in flight is bounded by the blocks reserved for it (see `kvtransfer.connector`)."""
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a send to a vanished peer raises instead of vanishing
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    return sock, bind_secured(sock, address, "kv", max_frame_bytes)


def connect_dealer(ctx: zmq.Context, address: str, send_timeout_ms: int) -> zmq.Socket:
    """A DEALER to a KV receiver; what comes back (acks, heartbeats) is small control messages."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)  # closing drops queued frames and the references to our blocks
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.SNDTIMEO, send_timeout_ms)
    connect_secured(sock, address)
    return sock


def send_message(sock: zmq.Socket, msg, frames=(), identity: bytes | None = None) -> None:
    """Send header + frames as one multipart; frames are buffers (memoryview, numpy, bytes)."""
    parts = ([identity] if identity is not None else []) + [encode(msg), *frames]
    last = len(parts) - 1
    for i, part in enumerate(parts):
        flags = 0 if i == last else zmq.SNDMORE
        sock.send(part, flags, copy=_nbytes(part) < _ZERO_COPY_MIN_BYTES)


def recv_parts(sock: zmq.Socket) -> list[zmq.Frame]:
    """One whole multipart message as frames (no copies); call only when the socket is readable."""
    return sock.recv_multipart(copy=False)


def decode_header(frame: zmq.Frame, expected=object):
    return decode(frame.buffer, expected)


def _nbytes(part) -> int:
    return memoryview(part).nbytes
