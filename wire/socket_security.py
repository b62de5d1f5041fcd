"""Every internal ZMQ socket is set up here: size limit, authentication, where it may bind, what it refused.

    address = bind_secured(sock, "tcp://127.0.0.1:0", kind="token_stream")   # a socket others connect to
    connect_secured(sock, address)                                            # a socket that connects to one
    ...
    refuse("token_stream", "malformed")    # a receive loop dropped an undecodable or wrong-type message

One call per socket, before it binds or connects. What it does:

- `MAXMSGSIZE` on the socket: libzmq drops the connection of a peer that sends
  a larger frame before any of it is buffered (counted `dropped_connection`).
- With a cluster key, CURVE: the bound side is a CURVE server, the connecting
  side a CURVE client, and a ZAP handler (pyzmq's ThreadAuthenticator, one per
  ZMQ context) admits only clients holding a cluster key's secret. A client
  without it never completes the handshake (counted `unauthenticated`, or
  `bad_handshake` when it speaks no CURVE, or no ZMTP at all).
- A socket bound with `senders` (below) admits no cluster key but the sender
  keys that function knows, and each message it receives carries its
  sender's public key (ZMQ's `User-Id`).
- Binds only to a given interface (loopback or the node's address), never to
  a wildcard.

The cluster key: one CURVE keypair per cluster, made by whoever starts the
cluster (`ClusterKey.generate()`, `cluster.deployment`), given to the router
in its config and to each worker in its `WorkerConfig.cluster_key`, which the
actor hands to `use_cluster_key` before it opens a socket. It travels in the
actor's creation arguments, never in Ray's runtime_env (which Ray's state API
and dashboard show). A process without a key (unit tests, scripts) runs its
sockets unauthenticated; size limits still hold; `TANDEM_CLUSTER_KEY` gives one
to a process started by hand.

A sender key: each process makes its own keypair (`sender_keypair()`); its
secret never leaves the process. The cluster key only says "a member"; a sender
key says which one, and a socket bound with `senders` admits only the senders
allowed to send what it takes, whatever else they hold:

- the router's token stream (`token_stream`): each registered worker's own
  key (told by its registration, `sender_key`), and each delta only from the
  workers running its request (the router checks `User-Id`);
- a worker's control ROUTER (`control`): the router's key only
  (`WorkerConfig.router_key`): its calls reserve and free KV blocks and say
  where the worker pushes tokens, first tokens and KV;
- the controller's membership ROUTER (`membership`): the router's key only
  (`ClusterSpec.router_key`): a `MembershipReport` says which workers are
  dead, and the controller kills them;
- decode's KV receiver admits any member's connection, but takes a request's
  chunks and a sender's Abort of it only with the request's transfer token
  (`transfer_token()`), which decode gives the router in its reservation and
  the router only the prefill worker it chose;
- decode's inbox takes a request's `FirstToken` or `PrefillFailed` only with
  the same token (what the prefill worker the router chose was given);
- a tensor-parallel worker's rank links (`runtime.rank_links`): a follower's
  control PULL admits rank 0's key only, rank 0's report PULL its followers'
  keys only (each rank is its own process with its own sender key).

The router's sender key is the serving process's own `sender_keypair()`: it
presents it on every control and membership DEALER (`router.control_client`);
the deployment hands its public half to the controller (`ClusterSpec.router_key`)
and, in their configs, to the workers. A worker or controller with a cluster
key but no router key admits no caller at all (`only("")`), never any member.

Counters (`refusals()`) are per process and per socket kind; the router
exports them to Prometheus as `tandem:internal_messages_refused_total`.
"""

from __future__ import annotations

import hmac
import itertools
import logging
import os
import secrets
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable
from urllib.parse import urlsplit

import zmq
from zmq.utils.monitor import recv_monitor_message

logger = logging.getLogger("tandem.wire")

ENV_VAR = "TANDEM_CLUSTER_KEY"
SMALL_MESSAGE_BYTES = 4 << 20  # control messages and token deltas (msgpack headers, never tensors)
_WILDCARD_HOSTS = {"*", "0.0.0.0", "::", ""}


@dataclass(frozen=True)
class ClusterKey:
    """A CURVE keypair (Z85 text): the cluster's, shared by every member (servers and clients both use it),
    or a worker process's own sender key (`sender_keypair`)."""

    public: str
    secret: str = field(repr=False)

    @classmethod
    def generate(cls) -> "ClusterKey":
        public, secret = zmq.curve_keypair()
        return cls(public.decode(), secret.decode())

    def encoded(self) -> str:
        return f"{self.public}:{self.secret}"

    @classmethod
    def parse(cls, text: str) -> "ClusterKey":
        public, separator, secret = text[:40], text[40:41], text[41:]  # Z85 itself may contain ':'
        if len(text) != 81 or separator != ":":
            raise ValueError("a cluster key must be '<public>:<secret>', each 40 Z85 characters")
        return cls(public, secret)


_process_key: list[ClusterKey] = []  # set by `use_cluster_key`; unset: the environment's


def use_cluster_key(text: str) -> None:
    """This process's sockets authenticate with the key `text` ('<public>:<secret>'), whatever
    `TANDEM_CLUSTER_KEY` says; "": the environment's, if any. A worker actor calls it first, with its
    config's key."""
    _process_key[:] = [ClusterKey.parse(text)] if text else []


def process_key() -> ClusterKey | None:
    """This process's cluster key (`use_cluster_key`, else `TANDEM_CLUSTER_KEY`; None: unauthenticated)."""
    if _process_key:
        return _process_key[0]
    text = os.environ.get(ENV_VAR, "")
    return ClusterKey.parse(text) if text else None


_sender_keypair: list[ClusterKey] = []
_sender_lock = threading.Lock()


def sender_keypair() -> ClusterKey:
    """This process's own keypair, made on first use: the identity its token deltas carry to the router."""
    with _sender_lock:
        if not _sender_keypair:
            _sender_keypair.append(ClusterKey.generate())
        return _sender_keypair[0]


def sender_public_key() -> str:
    """What a worker reports when it registers: its sender key's public half ("" without a cluster key,
    when nothing is authenticated)."""
    return sender_keypair().public if process_key() is not None else ""


def transfer_token() -> str:
    """A new secret for one request's KV transfer (`DecodeReservation.transfer_token`), or "" without a
    cluster key: the receiver takes a chunk or a sender's Abort for the request only with it. The decode
    worker makes it when it reserves; it travels only over CURVE-encrypted sockets, to the router and on
    to the prefill worker the router chose, so no other member can write into or abort that transfer."""
    return secrets.token_hex(16) if process_key() is not None else ""


def holds_token(expected: str, given: str) -> bool:
    """Whether a message carrying `given` may act on a transfer whose token is `expected` ("": no cluster
    key, no token, any message may), compared in constant time."""
    return not expected or hmac.compare_digest(given, expected)


def only(public_keys: str | Iterable[str], name: str) -> Callable[[str], str | None]:
    """A `senders` check admitting `public_keys` (one key, or several), each as `name` ("" admits nobody)."""
    admitted = {public_keys} if isinstance(public_keys, str) else set(public_keys)
    admitted.discard("")
    return lambda public: name if public in admitted else None


def bind_secured(sock: zmq.Socket, address: str, kind: str, max_message_bytes: int = SMALL_MESSAGE_BYTES,
                 key: ClusterKey | None = None, senders: Callable[[str], str | None] | None = None) -> str:  # fmt: skip
    """Limit, authenticate (with a key), watch and bind `sock`; return the address it bound (port 0 resolved).

    `kind` names the socket in the counters ("token_stream", "kv", "rank_link", "inbox", "control"...);
    `key` None: this process's key (`process_key()`), if it has one. `senders` (public key -> the
    sender's name, None: unknown), with a key: only those senders' keys are admitted, not the cluster's;
    it is called on the authenticator's thread."""
    host = urlsplit(address).hostname if address.startswith("tcp://") else "local"
    if host is None or host.strip("[]") in _WILDCARD_HOSTS:
        raise ValueError(f"{address}: internal sockets bind to one interface (loopback or the node's address)")
    key = key or process_key()
    sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    if key is not None:
        admitted = (lambda public: senders(public) is not None) if senders is not None else None
        _authenticator(sock.context).allow(kind, key, admitted)
        sock.setsockopt(zmq.ZAP_DOMAIN, kind.encode())
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_SECRETKEY, key.secret.encode())
    _MONITOR.watch(sock, kind)
    sock.bind(address)
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)


def connect_secured(sock: zmq.Socket, address: str, max_message_bytes: int = SMALL_MESSAGE_BYTES,
                    key: ClusterKey | None = None, sender: ClusterKey | None = None) -> None:  # fmt: skip
    """Limit what `sock` receives, present the cluster key (with one), and connect it to `address`.

    `sender`: the keypair to present instead of the cluster key (a worker's own, `sender_keypair()`,
    to a socket bound with `senders`); the server is still known by the cluster key."""
    key = key or process_key()
    sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    if key is not None:
        client = sender or key
        sock.setsockopt(zmq.CURVE_SERVERKEY, key.public.encode())
        sock.setsockopt(zmq.CURVE_PUBLICKEY, client.public.encode())
        sock.setsockopt(zmq.CURVE_SECRETKEY, client.secret.encode())
    sock.connect(address)


# -- refusals --

_refused: Counter = Counter()  # (socket kind, reason) -> count
_refused_lock = threading.Lock()
_LOGGED_PER_REASON = 10  # then quiet: a flood of garbage must not become a flood of log lines


def refuse(kind: str, reason: str, detail: object = "") -> None:
    """Count one refused message or connection on a `kind` socket (it was dropped, never acted on)."""
    with _refused_lock:
        _refused[kind, reason] += 1
        count = _refused[kind, reason]
    if count <= _LOGGED_PER_REASON:  # a peer leaving is routine; anything else is worth a warning
        level = logging.DEBUG if reason == "dropped_connection" else logging.WARNING
        logger.log(level, "refused on a %s socket (%s): %s", kind, reason, detail)


def refusals() -> dict[tuple[str, str], int]:
    """(socket kind, reason) -> how many this process refused: malformed, wrong_type (receive loops),
    unauthenticated, bad_handshake, dropped_connection (libzmq: an oversized frame, a protocol
    error, or a peer that went away), wrong_transfer_token (a KV chunk, a sender's Abort, a first
    token or a prefill failure for a request the sender was not given)."""
    with _refused_lock:
        return dict(_refused)


# -- authentication: one ZAP handler per ZMQ context --


class _KeyCheck:
    """The ZAP callback: a client is let in if it holds the secret of a key some socket here was bound
    with, or, on a domain bound with senders, if that domain's check knows its key."""

    def __init__(self):
        self.allowed: set[str] = set()
        self.by_domain: dict[str, Callable[[str], bool]] = {}

    def callback(self, domain: str, client_key: bytes | str) -> bool:
        key = client_key.decode() if isinstance(client_key, bytes) else client_key
        check = self.by_domain.get(domain)
        return check(key) if check is not None else key in self.allowed


class _Authenticator:
    def __init__(self, context: zmq.Context):
        from zmq.auth.thread import ThreadAuthenticator

        self._check = _KeyCheck()
        self._auth = ThreadAuthenticator(zmq.Context.shadow(context.underlying), log=logging.getLogger("tandem.zap"))
        self._auth.start()

    def allow(self, kind: str, key: ClusterKey, admitted: Callable[[str], bool] | None = None) -> None:
        if admitted is not None:
            self._check.by_domain[kind] = admitted
        else:
            self._check.allowed.add(key.public)
        self._auth.configure_curve_callback(domain=kind, credentials_provider=self._check)


_authenticators: dict[int, _Authenticator] = {}
_authenticators_lock = threading.Lock()


def _authenticator(context: zmq.Context) -> _Authenticator:
    with _authenticators_lock:
        if context.underlying not in _authenticators:
            _authenticators[context.underlying] = _Authenticator(context)
        return _authenticators[context.underlying]


# -- what libzmq refused, read from socket monitors on one thread --


def open_monitor(sock: zmq.Socket, events: int, endpoint: str | None = None) -> zmq.Socket:
    """A PAIR that receives `sock`'s monitor `events`, with no high-water mark.

    libzmq's I/O thread blocks when a monitor's queue is full, and with it every socket of the
    context (a client retrying a dead peer emits an event per retry): here unread events cost
    memory, never the process's sockets. The caller reads and closes the PAIR."""
    endpoint = endpoint or f"inproc://tandem-monitor-{os.getpid()}-{id(sock):x}-{next(_monitor_ids)}"
    sock.monitor(endpoint, events)
    pair = zmq.Context.shadow(sock.context.underlying).socket(zmq.PAIR)
    pair.setsockopt(zmq.LINGER, 0)
    pair.setsockopt(zmq.RCVHWM, 0)  # set before connecting: the inproc pipe then has no bound
    pair.connect(endpoint)
    return pair


_monitor_ids = itertools.count()

_EVENT_REASONS = {
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "unauthenticated",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "bad_handshake",
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "bad_handshake",
    zmq.EVENT_DISCONNECTED: "dropped_connection",
}


class _Monitor:
    """A daemon thread reading the monitor PAIR of every bound socket; a socket's closing ends its monitor."""

    def __init__(self):
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._added: list[tuple[zmq.Socket, str]] = []
        self._thread: threading.Thread | None = None

    def watch(self, sock: zmq.Socket, kind: str) -> None:
        endpoint = f"inproc://tandem-monitor-{os.getpid()}-{next(self._ids)}"
        events = 0
        for event in _EVENT_REASONS:
            events |= event
        pair = open_monitor(sock, events, endpoint)
        with self._lock:
            self._added.append((pair, kind))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="zmq-monitor", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        poller, kinds = zmq.Poller(), {}
        while True:
            with self._lock:
                added, self._added = self._added, []
            for pair, kind in added:
                poller.register(pair, zmq.POLLIN)
                kinds[pair] = kind
            for pair, _ in poller.poll(100):
                event = recv_monitor_message(pair)
                if event["event"] == zmq.EVENT_MONITOR_STOPPED:
                    poller.unregister(pair)
                    kinds.pop(pair)
                    pair.close()
                elif event["event"] in _EVENT_REASONS:
                    refuse(kinds[pair], _EVENT_REASONS[event["event"]], event["endpoint"].decode(errors="replace"))


_MONITOR = _Monitor()
