"""The one place the control plane's ZMQ sockets are made (worker ROUTERs, router DEALERs).

The socket options of the control plane are set here; the size limit and
authentication (the cluster's CURVE key) by `wire.socket_security` as
the server binds and the client connects.

ZMTP heartbeats, on both ends: each side pings the other every
`HEARTBEAT_IVL_MS`; a peer that answers nothing (not even ZMQ's own I/O
thread, which answers whatever the worker's step loop is doing) for
`HEARTBEAT_TIMEOUT_MS` is disconnected. So a dead host or a cut network shows
as a disconnect (the router's `ControlClient` then fails its calls fast and
reports the worker missing), while a busy worker never does. The timeout is
long enough that a process stopped for a few seconds (SIGSTOP, a swap storm, a
long GC pause: all ZMQ threads frozen too) is not disconnected: 15 s covers
an 8 s stop with margin. `HEARTBEAT_TTL` tells the peer the same limit for us.
"""

from __future__ import annotations

import zmq

# A control message carries one request (prompt token ids) or one load report: far below this.
MAX_CONTROL_MESSAGE_BYTES = 16 * 1024 * 1024

HEARTBEAT_IVL_MS = 1_000
HEARTBEAT_TIMEOUT_MS = 15_000
HEARTBEAT_TTL_MS = 15_000  # ZMQ rounds it to deciseconds
# A peer that refuses is retried after 100 ms, then less and less often, at most every 2 s: a restarted
# worker binds a new port (a new client reaches it), and each retry is one more monitor event to read.
RECONNECT_IVL_MAX_MS = 2_000


def control_socket(ctx: zmq.Context, kind: int) -> zmq.Socket:
    """A ROUTER (worker side, to bind) or DEALER (router side, to connect) with the control plane's options.

    Its size limit and authentication come with `bind_secured` / `connect_secured` (a peer sending a message
    over `MAX_CONTROL_MESSAGE_BYTES` is disconnected by ZMQ before it is read)."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
    sock.setsockopt(zmq.HEARTBEAT_TTL, HEARTBEAT_TTL_MS)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)
    if kind == zmq.ROUTER:
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a reply to a vanished router raises instead of vanishing
    return sock
