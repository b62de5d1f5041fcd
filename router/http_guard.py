"""What every HTTP request passes before the API sees it: the Host check, the API key, the admin token and
the body size limit.

    app.add_middleware(RequestGuard, api_key="sk-...", max_body_bytes=8 << 20, admin_token="...",
                       allowed_hosts=("127.0.0.1", "localhost", "::1"))

With `allowed_hosts` (a router on loopback has them by default), a request whose Host header names another
host is refused (400), and so is one whose Origin names another (403): a web page in the operator's browser
cannot reach the router by DNS rebinding or a cross-site form. With an API key, every /v1/* request must
carry `Authorization: Bearer <key>` (401 otherwise), and so must /tokenize and /detokenize (tokenizing is
the router's work, as a completion's is); /health and /metrics stay open, as in vLLM. /admin/*
needs the admin token (`cluster.admin_token`) and nothing else opens it: without one it is closed (403).
A body over the limit is refused with 413 before the app reads it:
the declared Content-Length is checked first, and a body without one is
buffered only up to the limit. Both answers are OpenAI-format errors.
Across all connections at once, the bodies being buffered share a bound too (`max_buffered_bytes`): without
it, thousands of connections each trickling a body under the limit would hold gigabytes. A body that would
pass it is refused at once with 503 and Retry-After; its bytes are counted from its declared length (or as
they arrive) until the app has been handed the body or the request ends, whichever comes first.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
from urllib.parse import urlsplit

from router.errors import APIError

_API = ("/v1/", "/tokenize", "/detokenize")  # what the API key guards (the tokenizer is work on the router)
_DRAINED = 4  # a body over the limit but within this many times it is read (and dropped) before the 413
_GONE = object()  # what `_read_body` returns when the client left
_BUSY = object()  # what `_read_body` returns when the bodies buffered at once would pass their bound
_ADMIN = "/admin/"
_BUSY_RETRY_AFTER_S = 1  # buffered bodies are read in seconds: a retry soon finds room
_BUSY_DRAIN_S = 0.25  # how long a refused body's bytes are read (and dropped) before the 503
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


def allowed_hosts_for(bind_host: str, configured: tuple[str, ...] = ()) -> tuple[str, ...] | None:
    """The Host names a router bound to `bind_host` answers: `configured`, else the loopback names when it
    listens on loopback; None (any Host) for another address with none configured."""
    if configured:
        return configured
    return (*LOOPBACK_NAMES, bind_host) if bind_host in LOOPBACK_NAMES or bind_host.startswith("127.") else None


class RequestGuard:
    """Pure ASGI middleware (streamed responses pass through untouched)."""

    def __init__(self, app, api_key: str | None, max_body_bytes: int, admin_token: str | None = None,
                 allowed_hosts: tuple[str, ...] | None = None, max_buffered_bytes: int = 256 << 20):  # fmt: skip
        self.app, self.max_body_bytes = app, max_body_bytes
        self._buffered = BufferedBytes(max_buffered_bytes)
        self._key = api_key.encode() if api_key else None
        self._admin = admin_token.encode() if admin_token else None
        self._hosts = {h.lower() for h in allowed_hosts} if allowed_hosts is not None else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        refusal = self._refusal(scope["path"], headers)
        if refusal is not None:
            return await refusal.response()(scope, receive, send)
        declared = headers.get(b"content-length", b"0")
        if not declared.isdigit() or int(declared) > self.max_body_bytes:
            drain = declared.isdigit() and int(declared) <= _DRAINED * self.max_body_bytes
            return await self._too_large(scope, receive, send, drain)
        held = _Held(self._buffered)
        try:
            if not held.take(int(declared)):
                return await self._refuse_busy(scope, receive, send, more=int(declared) > 0)
            body, more = await self._read_body(receive, held)
            if body is _GONE:
                return  # the client left before its body ended (or its body deadline passed): nobody to answer
            if body is _BUSY:
                return await self._refuse_busy(scope, receive, send, more)
            if body is None:
                held.release()  # what is drained is dropped as it comes, never held
                return await self._too_large(scope, receive, send, drain=more)
            await self.app(scope, _replay(body, receive, on_handed=held.release), send)
        finally:
            held.release()  # the client left, the app failed or the answer is sent: never a leaked count

    def _refusal(self, path: str, headers: dict[bytes, bytes]) -> APIError | None:
        if self._hosts is not None:
            if _hostname(headers.get(b"host", b"").decode("latin-1")) not in self._hosts:
                return APIError(400, "this server does not answer for that Host", code="invalid_host")
            origin = headers.get(b"origin")
            if origin is not None and _hostname(urlsplit(origin.decode("latin-1")).netloc) not in self._hosts:
                return APIError(403, "requests from another origin are refused", code="invalid_origin")
        if path.startswith(_ADMIN) and not (self._admin is not None and _bearer(headers, self._admin)):
            closed = "the admin endpoints are closed" if self._admin is None else "missing or invalid admin token"
            return APIError(403, f"{closed}: `tandem scale` / `tandem status` send the token `tandem serve` wrote",
                            code="invalid_admin_token")  # fmt: skip
        if self._key is not None and path.startswith(_API) and not _bearer(headers, self._key):
            return APIError(401, "missing or invalid API key: send the header `Authorization: Bearer <key>`",
                            code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})  # fmt: skip
        return None

    async def _read_body(self, receive, held: _Held) -> tuple[bytes | object | None, bool]:
        """(the whole body; None once it passes the limit (a client may send more than it declared), `_GONE`
        if the client left first, `_BUSY` if what it sent beyond its declared length does not fit the bytes
        all bodies may hold at once) and whether more of the body is still to come (after None or `_BUSY`)."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return _GONE, False
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if not held.take(size - held.bytes):  # a body without a (truthful) Content-Length
                return _BUSY, more
            if size > self.max_body_bytes:
                return None, more  # no more: asking `receive` again would wait for the client to leave
            if not more:
                return b"".join(chunks), False

    async def _too_large(self, scope, receive, send, drain: bool):
        """413; with `drain`, after reading what is left of the body up to a few times the limit (dropped as
        it comes): a client still sending when the connection closes gets a reset, never the answer (urllib
        did so for 9 MiB). A body declared larger is answered at once, the connection closed under it."""
        if drain:
            await _drain(receive, _DRAINED * self.max_body_bytes)
        error = APIError(413, f"the request body is larger than the limit of {self.max_body_bytes} bytes",
                         code="request_too_large")  # fmt: skip
        await error.response()(scope, receive, send)


    async def _refuse_busy(self, scope, receive, send, more: bool):
        """503 with Retry-After; first, for a moment, what arrives of the body is read and dropped (never held):
        the connection closes after the answer, and a client still sending into it then gets a reset instead
        of the 503 (seen in CI: a 30 KiB upload refused at once). A slow upload is not waited for."""
        if more:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(_drain(receive, self.max_body_bytes), _BUSY_DRAIN_S)
        await _busy().response()(scope, receive, send)


async def _drain(receive, at_most: int) -> None:
    """Read and drop the rest of the request body, up to `at_most` bytes."""
    dropped = 0
    while dropped <= at_most:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            return
        dropped += len(message.get("body", b""))


def _bearer(headers: dict[bytes, bytes], secret: bytes) -> bool:
    scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), secret)


def _hostname(netloc: str) -> str:
    """The host of a Host header or URL netloc, without port or IPv6 brackets, lower case."""
    host = netloc.rpartition("@")[2]
    if host.startswith("["):
        return host[1 : host.find("]")].lower()
    return host.rsplit(":", 1)[0].lower() if host.count(":") == 1 else host.lower()


def _replay(body: bytes, receive, on_handed):
    """A `receive` that hands the app the buffered body once (then calls `on_handed`: the body is the app's
    now, parsed and dropped in a moment), then the client's own messages (disconnects)."""
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            on_handed()
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


def _busy() -> APIError:
    # 503, not 413: this body is within its own limit and would be taken a moment later; 413 would tell the
    # client to shrink it, when waiting is what helps (OpenAI's clients retry a 503 after Retry-After).
    return APIError(503, "the server is buffering too many request bodies at once; retry shortly",
                    code="server_busy", headers={"Retry-After": str(_BUSY_RETRY_AFTER_S)})  # fmt: skip


class BufferedBytes:
    """The bytes of request bodies buffered at once, across every connection, and their bound. One event loop
    takes and gives them: no lock needed."""

    def __init__(self, bound: int):
        self.bound, self.held = bound, 0

    def take(self, n: int) -> bool:
        if self.held + n > self.bound:
            return False
        self.held += n
        return True

    def give(self, n: int) -> None:
        self.held -= n


class _Held:
    """What one request holds of `BufferedBytes`; released once, however the request ends."""

    def __init__(self, buffered: BufferedBytes):
        self._buffered, self.bytes = buffered, 0

    def take(self, n: int) -> bool:
        if n <= 0:
            return True
        if not self._buffered.take(n):
            return False
        self.bytes += n
        return True

    def release(self) -> None:
        self._buffered.give(self.bytes)
        self.bytes = 0
