"""The router's connection deadlines and bound (router.http_protocol), on a real uvicorn over loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from starlette.requests import ClientDisconnect

from router.http_protocol import ConnectionLimits, protocol_for

LIMITS = ConnectionLimits(header_timeout_s=0.5, body_timeout_s=0.5, write_timeout_s=0.5, max_connections=8)


def _app(state: dict) -> FastAPI:
    app = FastAPI()

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.post("/echo")
    async def echo(request: Request):
        try:
            return {"size": len(await request.body())}
        except ClientDisconnect:  # the body deadline passed: nobody is left to answer
            state["body_cut"] = True

    @app.get("/endless")
    async def endless():
        async def chunks():
            while True:
                yield b"x" * 65536

        return StreamingResponse(chunks())

    return app


@pytest.fixture
def served():
    """(port, state) of a uvicorn with LIMITS, on a thread."""
    state: dict = {}
    config = uvicorn.Config(_app(state), host="127.0.0.1", port=0, loop="uvloop", http=protocol_for(LIMITS),
                            ws="none", log_level="warning")  # fmt: skip
    server = uvicorn.Server(config)
    sock = socket.create_server(("127.0.0.1", 0))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield sock.getsockname()[1], state
    server.should_exit = True
    thread.join(10)
    sock.close()


def _connect(port: int, rcvbuf: int | None = None) -> socket.socket:
    conn = socket.socket()
    if rcvbuf:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    conn.connect(("127.0.0.1", port))
    conn.settimeout(5)
    return conn


def _read_all(conn: socket.socket) -> bytes:
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
    return data


def _health(conn: socket.socket) -> bytes:
    conn.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    reply = b""
    while not reply.endswith(b"}"):
        reply += conn.recv(4096)
    return reply


def _status_and_error(reply: bytes) -> tuple[int, dict]:
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)["error"]


def test_a_connection_that_sends_nothing_is_closed_at_the_header_deadline(served):
    port, _ = served
    conn = _connect(port)
    start = time.monotonic()
    status, error = _status_and_error(_read_all(conn))
    assert status == 408 and error["code"] == "request_timeout"
    assert 0.4 < time.monotonic() - start < 3


def test_headers_sent_a_byte_at_a_time_are_cut_at_the_deadline(served):
    port, _ = served
    conn = _connect(port)
    start = time.monotonic()
    with pytest.raises(OSError):
        for byte in b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100:
            conn.send(bytes([byte]))
            time.sleep(0.05)
    assert time.monotonic() - start < 3


def test_a_body_that_never_ends_is_cut_at_its_deadline_and_keep_alive_requests_are_unaffected(served):
    port, _ = served
    conn = _connect(port)
    conn.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + b"y" * 10)
    status, _ = _status_and_error(_read_all(conn))
    assert status == 408
    # A client slower than the header deadline between whole requests is only bound by keep-alive.
    conn = _connect(port)
    for _ in range(3):
        assert _health(conn).startswith(b"HTTP/1.1 200")
        time.sleep(0.3)


def test_a_client_that_stops_reading_is_dropped_at_the_write_deadline(served):
    port, _ = served
    conn = _connect(port, rcvbuf=4096)
    conn.sendall(b"GET /endless HTTP/1.1\r\nHost: x\r\n\r\n")
    time.sleep(LIMITS.write_timeout_s + 1.0)  # read nothing past the deadline
    received, start = 0, time.monotonic()
    with contextlib.suppress(ConnectionResetError):  # the end of what the kernel held, then EOF (or a reset)
        while chunk := conn.recv(65536):
            received += len(chunk)
            assert time.monotonic() - start < 5, "the endless stream is still being written"
    assert received < 16 << 20  # what the kernel's buffers held, no more


def test_connections_beyond_the_bound_are_refused_with_503_and_health_answers_after(served):
    port, _ = served
    held = [_connect(port) for _ in range(LIMITS.max_connections)]
    time.sleep(0.1)
    status, error = _status_and_error(_read_all(_connect(port)))
    assert status == 503 and error["code"] == "too_many_connections"
    for conn in held:
        conn.close()
    time.sleep(0.1)
    assert _health(_connect(port)).startswith(b"HTTP/1.1 200")
