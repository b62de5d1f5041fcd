"""The one place the control plane's ZMQ sockets are made (worker ROUTERs, router DEALERs).

The socket options of the control plane are set here; the size limit and
authentication (the cluster's CURVE key) by `kvtransfer.socket_security` as
the server binds and the client connects.
"""

from __future__ import annotations

import zmq

# A control message carries one request (prompt token ids) or one load report: far below this.
MAX_CONTROL_MESSAGE_BYTES = 16 * 1024 * 1024


def control_socket(ctx: zmq.Context, kind: int, max_message_bytes: int = MAX_CONTROL_MESSAGE_BYTES) -> zmq.Socket:
    """A ROUTER (worker side, to bind) or DEALER (router side, to connect) with the control plane's options.

    A peer sending a message over `max_message_bytes` is disconnected by ZMQ before it is read."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    if kind == zmq.ROUTER:
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a reply to a vanished router raises instead of vanishing
    return sock
