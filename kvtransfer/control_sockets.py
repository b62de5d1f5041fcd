"""The one place the control plane's ZMQ sockets are made (worker ROUTERs, router DEALERs).

The socket options of the control plane are set here; the size limit and
authentication (the cluster's CURVE key) by `kvtransfer.socket_security` as
the server binds and the client connects.
"""

from __future__ import annotations

import zmq

# A control message carries one request (prompt token ids) or one load report: far below this.
MAX_CONTROL_MESSAGE_BYTES = 16 * 1024 * 1024


def control_socket(ctx: zmq.Context, kind: int) -> zmq.Socket:
    """A ROUTER (worker side, to bind) or DEALER (router side, to connect) with the control plane's options.

    Its size limit and authentication come with `bind_secured` / `connect_secured` (a peer sending a message
    over `MAX_CONTROL_MESSAGE_BYTES` is disconnected by ZMQ before it is read)."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    if kind == zmq.ROUTER:
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a reply to a vanished router raises instead of vanishing
    return sock
