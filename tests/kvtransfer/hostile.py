"""Hostile traffic for an internal socket: what the security tests throw at each socket kind.

    clients = send_hostile(address, key, oversized_bytes, zmq.PUSH)   # then poll the receiver a while
    wait_refused(refusals, before, kind)                               # every kind of refusal was counted
    close_all(clients)

Each attack is something a stranger on the network, or a buggy peer, could send:
bytes that are no msgpack, a well-formed message of a type the socket never
takes, a frame over the size limit (these three from a client holding the key,
so they reach the receive loop or the size check), a CURVE client with a key
of its own, a client without CURVE, and raw bytes that are not ZMTP at all.
"""

from __future__ import annotations

import os
import socket
import time

import zmq

from wire.codec import encode
from wire.kv import Refused
from wire.socket_security import ClusterKey, connect_secured

# Each reason a refusal counter must show after `send_hostile` (see `socket_security.refusals`).
EXPECTED_REASONS = ("malformed", "wrong_type", "dropped_connection", "unauthenticated", "bad_handshake")
NOT_MSGPACK = b"\xc1" + os.urandom(63)  # 0xc1 is never used by msgpack: undecodable whatever follows
WRONG_TYPE = encode(Refused("a message no bound socket takes"))


def send_hostile(address: str, key: ClusterKey, oversized_bytes: int, sock_type: int = zmq.PUSH,
                 insider: ClusterKey | None = None) -> list:  # fmt: skip
    """Send every attack to `address`; return the clients, to close once the counters were read
    (a client still open shows that the dropped connection was the receiver's doing). `insider`: the
    keypair the socket admits, when not the cluster key (a registered worker's, on the router's stream)."""
    ctx = zmq.Context.instance()
    clients = []

    def client(key_for_curve: ClusterKey | None, server_key: ClusterKey | None = key) -> zmq.Socket:
        sock = ctx.socket(sock_type)
        sock.setsockopt(zmq.LINGER, 0)
        if key_for_curve is not None:
            sock.setsockopt(zmq.CURVE_SERVERKEY, server_key.public.encode())
            sock.setsockopt(zmq.CURVE_PUBLICKEY, key_for_curve.public.encode())
            sock.setsockopt(zmq.CURVE_SECRETKEY, key_for_curve.secret.encode())
        sock.connect(address)
        clients.append(sock)
        return sock

    member = ctx.socket(sock_type)
    member.setsockopt(zmq.LINGER, 0)
    connect_secured(member, address, key=key, sender=insider)
    clients.append(member)
    send_unless_refused(member, NOT_MSGPACK)
    send_unless_refused(member, WRONG_TYPE)
    oversized = ctx.socket(sock_type)  # its own connection: the receiver drops it, not the insider's
    oversized.setsockopt(zmq.LINGER, 0)
    connect_secured(oversized, address, key=key, sender=insider)
    clients.append(oversized)
    send_unless_refused(oversized, b"\x00" * oversized_bytes)
    send_unless_refused(client(ClusterKey.generate()), WRONG_TYPE)  # CURVE, but not the cluster's key
    send_unless_refused(client(None), WRONG_TYPE)  # no CURVE at all
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    raw = socket.create_connection((host, int(port)))
    raw.sendall(os.urandom(4096))
    clients.append(raw)
    return clients


_SEND_TIMEOUT_MS = 2000


def send_unless_refused(sock: zmq.Socket, data: bytes) -> None:
    """Send `data`, unless the receiver refused this client's handshake first: libzmq then tears down the
    client's pipe and a send would block for ever (a race with the handshake, not a failure to refuse)."""
    sock.setsockopt(zmq.SNDTIMEO, _SEND_TIMEOUT_MS)
    try:
        sock.send(data)
    except zmq.Again:
        pass


def delta(refusals: dict, before: dict, kind: str) -> dict[str, int]:
    return {reason: refusals.get((kind, reason), 0) - before.get((kind, reason), 0) for reason in EXPECTED_REASONS}


def wait_refused(read_refusals, before: dict, kind: str, poll=lambda: None, timeout_s: float = 30.0,
                 reasons: tuple[str, ...] = EXPECTED_REASONS) -> dict:  # fmt: skip
    """Call `poll` (drive the receive loop) until each of `reasons` was counted on `kind`; return the counts."""
    deadline = time.monotonic() + timeout_s
    while True:
        counts = delta(read_refusals(), before, kind)
        if all(counts[reason] for reason in reasons):
            return counts
        if time.monotonic() > deadline:
            raise AssertionError(f"{kind}: not every attack was refused and counted: {counts}")
        poll()
        time.sleep(0.01)


def close_all(clients: list) -> None:
    for client in clients:
        client.close()
