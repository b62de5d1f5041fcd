"""What every HTTP request passes before the API sees it: the API key and the body size limit.

    app.add_middleware(RequestGuard, api_key="sk-...", max_body_bytes=8 << 20)

With an API key, every /v1/* and /admin/* request must carry
`Authorization: Bearer <key>` (401 otherwise); /health and /metrics stay open,
as in vLLM. A body over the limit is refused with 413 before the app reads it:
the declared Content-Length is checked first, and a body without one is
buffered only up to the limit. Both answers are OpenAI-format errors.
"""

from __future__ import annotations

import hmac

from router.errors import APIError

_PROTECTED = ("/v1/", "/admin/")


class RequestGuard:
    """Pure ASGI middleware (streamed responses pass through untouched)."""

    def __init__(self, app, api_key: str | None, max_body_bytes: int):
        self.app, self.max_body_bytes = app, max_body_bytes
        self._key = api_key.encode() if api_key else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        if self._key is not None and scope["path"].startswith(_PROTECTED) and not self._authorized(headers):
            error = APIError(401, "missing or invalid API key: send the header `Authorization: Bearer <key>`",
                             code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})  # fmt: skip
            return await error.response()(scope, receive, send)
        declared = headers.get(b"content-length", b"0")
        if not declared.isdigit() or int(declared) > self.max_body_bytes:
            return await self._too_large(scope, receive, send)
        body = await self._read_body(receive)
        if body is None:
            return await self._too_large(scope, receive, send)
        await self.app(scope, _replay(body, receive), send)

    def _authorized(self, headers: dict[bytes, bytes]) -> bool:
        scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._key)

    async def _read_body(self, receive) -> bytes | None:
        """The whole body, or None once it passes the limit (a client may send more than it declared)."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left: the app sees an empty body and the disconnect
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body_bytes:
                return None
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    async def _too_large(self, scope, receive, send):
        error = APIError(413, f"the request body is larger than the limit of {self.max_body_bytes} bytes",
                         code="request_too_large")  # fmt: skip
        await error.response()(scope, receive, send)


def _replay(body: bytes, receive):
    """A `receive` that hands the app the buffered body once, then the client's own messages (disconnects)."""
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
