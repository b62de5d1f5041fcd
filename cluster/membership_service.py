"""The controller's membership socket: the router's long poll (`wire.membership`), served on its own thread.

    router_sync's DEALER ── ControlCall("sync", MembershipReport) ──► ROUTER (thread "membership")
                         ◄── ControlReply(WantedMembership) ────────  Membership.sync: waits at most
                                                                      a poll interval for a change

One router syncs at a time, so calls are served one after another on this thread.
The socket binds to loopback: the controller actor is pinned to the router's node
(`cluster.controller_actor.start_controller`). It is a control socket like a worker's
(`wire.control_sockets`: ZMTP heartbeats, size limit, the cluster key's CURVE admitting the
router's own key only), so a killed controller shows at the router as a dropped connection,
and the router asks Ray where the restarted one listens.
"""

from __future__ import annotations

import logging
import threading

import zmq

from cluster.membership import Membership
from wire.codec import DecodeError, encode
from wire.control import ControlReply, read_call
from wire.control_sockets import MAX_CONTROL_MESSAGE_BYTES, control_socket
from wire.membership import MembershipReport
from wire.socket_security import ClusterKey, bind_secured, only, refuse

logger = logging.getLogger("tandem.cluster")

_POLL_MS = 200  # how soon `close` is noticed


class MembershipService:
    """Serves `membership.sync` at `address` until `close()`; owns its socket and thread."""

    def __init__(self, membership: Membership, key: ClusterKey | None = None, router_key: str = "",
                 address: str = "tcp://127.0.0.1:0"):  # fmt: skip
        """With `key` (the cluster's), only `router_key` (the router's sender key, public half) is admitted:
        a report says which workers the router holds, and the controller kills what it reports dead."""
        self.membership = membership
        self._sock = control_socket(zmq.Context.instance(), zmq.ROUTER)
        self.address = bind_secured(self._sock, address, "membership", MAX_CONTROL_MESSAGE_BYTES, key=key,
                                    senders=only(router_key, "router"))  # fmt: skip
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="membership", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close(linger=0)

    def _serve(self) -> None:
        while not self._stop.is_set():
            if self._sock.poll(_POLL_MS, zmq.POLLIN):
                self._take(self._sock.recv_multipart())

    def _take(self, parts: list[bytes]) -> None:
        try:
            identity, call = read_call(parts)
        except DecodeError as e:
            return self._drop(str(e))
        if call.method != "sync" or not isinstance(call.payload, MembershipReport):
            what = f"{call.method!r} with {type(call.payload).__name__}"
            return self._send(identity, ControlReply(call.call_id, error=f"expected sync, got {what}", rejected=True))
        try:
            reply = ControlReply(call.call_id, self.membership.sync(call.payload))
        except Exception as e:  # a bug here must not end the thread: the router would never sync again
            logger.exception("membership sync failed")
            reply = ControlReply(call.call_id, error=f"{type(e).__name__}: {e}")
        self._send(identity, reply)

    def _drop(self, why: str) -> None:
        refuse("membership", "malformed", why)
        logger.warning("membership socket %s dropped a message: %s", self.address, why)

    def _send(self, identity: bytes, reply: ControlReply) -> None:
        try:
            self._sock.send_multipart([identity, encode(reply)], zmq.NOBLOCK)
        except zmq.ZMQError as e:  # the router that called is gone (ROUTER_MANDATORY)
            logger.warning("membership socket %s: reply to a gone router dropped: %s", self.address, e)
