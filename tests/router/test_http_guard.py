"""The HTTP front door of a real router (uvicorn on loopback, no workers): Host and Origin, API key, admin
token, body limit, error text.

With no worker registered, a request that gets past the guard is answered 503
(no live worker): that status is how these tests see the guard let it through.
"""

from __future__ import annotations

import logging
import socket
import time

import httpx
import openai
import pytest

from cluster.admin import install_admin_routes
from cluster.cli import AdminError, _admin
from router.app import create_app
from router.config import RouterConfig
from router.errors import from_dispatch
from router.server import RouterServer

KEY = "sk-test-key"
ADMIN = "admin-test-token"
BODY_LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def router(tiny_model_dirs):
    config = RouterConfig(tiny_model_dirs["llama"], "tiny", api_key=KEY, max_request_body_bytes=BODY_LIMIT,
                          admin_token=ADMIN)  # fmt: skip
    app = create_app(config)
    # With no controller behind them: a call past the guard (and the scale bounds) fails inside.
    install_admin_routes(app, {"prefill": (1, 4), "decode": (1, 4)})
    server = RouterServer(app)
    yield server
    server.stop()


def _is_openai_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_openai_client_needs_the_key(router):
    good = openai.OpenAI(base_url=f"{router.url}/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.APIStatusError) as err:  # past the guard: no worker yet, so not ready
        good.models.list()
    assert err.value.status_code == 503
    bad = openai.OpenAI(base_url=f"{router.url}/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as err:
        bad.models.list()
    assert err.value.status_code == 401 and err.value.code == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model="tiny", prompt="hi", max_tokens=1)
    with pytest.raises(openai.APIStatusError) as err:  # past the guard: refused for want of a worker, not the key
        good.completions.create(model="tiny", prompt="hi", max_tokens=1)
    assert err.value.status_code == 503


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer"}, {"Authorization": f"Basic {KEY}"},
                                     {"Authorization": f"Bearer {KEY}x"}])  # fmt: skip
def test_every_v1_path_refuses_without_the_key_and_admin_without_the_admin_token(router, headers):
    with httpx.Client(base_url=router.url, headers=headers) as http:
        for method, path in (("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("GET", "/v1/nope"),
                             ("POST", "/tokenize"), ("POST", "/detokenize")):
            error = _is_openai_error(http.request(method, path, json={}), 401)
            assert error["code"] == "invalid_api_key"
        for method, path in (("GET", "/admin/status"), ("POST", "/admin/scale")):
            assert _is_openai_error(http.request(method, path, json={}), 403)["code"] == "invalid_admin_token"


def test_the_api_key_does_not_open_the_admin_surface_and_scaling_is_bounded(router):
    with httpx.Client(base_url=router.url) as http:
        as_client = {"Authorization": f"Bearer {KEY}"}
        assert _is_openai_error(http.post("/admin/scale", json={"prefill": 0}, headers=as_client), 403)
        admin = {"Authorization": f"Bearer {ADMIN}"}
        for sizes, role in (({"prefill": 0}, "prefill"), ({"decode": 100_000}, "decode")):
            error = _is_openai_error(http.post("/admin/scale", json=sizes, headers=admin), 400)
            assert error["param"] == role and error["code"] == "invalid_scale"


def test_a_foreign_host_or_origin_is_refused(router):
    auth = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=router.url, headers=auth) as http:
        rebound = http.get("/v1/models", headers={"Host": "evil.example:8000"})  # DNS rebinding
        assert _is_openai_error(rebound, 400)["code"] == "invalid_host"
        cross_site = http.post("/admin/scale", json={}, headers={"Origin": "http://evil.example"})
        assert _is_openai_error(cross_site, 403)["code"] == "invalid_origin"
        for host in (f"localhost:{router.port}", f"127.0.0.1:{router.port}", "[::1]"):
            assert http.get("/v1/models", headers={"Host": host}).status_code == 503  # let through
        assert http.get("/v1/models", headers={"Origin": f"http://localhost:{router.port}"}).status_code == 503


def test_tokenize_takes_the_key_and_refuses_what_cannot_fit_before_tokenizing(router):
    max_model_len = router.app.state.router.runner.model.max_model_len
    with httpx.Client(base_url=router.url, headers={"Authorization": f"Bearer {KEY}"}) as http:
        assert http.post("/tokenize", json={"prompt": "hello"}).json()["count"] > 0
        assert http.post("/detokenize", json={"tokens": [1, 2, 3]}).status_code == 200
        chat = {"messages": [{"role": "user", "content": "a"}] * (max_model_len + 1)}
        assert _is_openai_error(http.post("/tokenize", json=chat), 400)["param"] == "messages"
        too_many = http.post("/detokenize", json={"tokens": [1] * (max_model_len + 1)})
        assert _is_openai_error(too_many, 400)["param"] == "tokens"


def test_health_and_metrics_stay_open(router):
    with httpx.Client(base_url=router.url) as http:
        assert http.get("/health").status_code == 503  # open, and honest: no worker yet
        metrics = http.get("/metrics")
        assert metrics.status_code == 200 and 'status="401"' in metrics.text


def test_a_body_over_the_limit_gets_413(router):
    auth = {"Authorization": f"Bearer {KEY}"}
    big = {"model": "tiny", "prompt": "x" * BODY_LIMIT}
    with httpx.Client(base_url=router.url, headers=auth) as http:
        assert _is_openai_error(http.post("/v1/completions", json=big), 413)["code"] == "request_too_large"

        def chunked():  # no Content-Length: the guard counts what arrives
            for _ in range(BODY_LIMIT // 1024 + 1):
                yield b" " * 1024

        assert _is_openai_error(http.post("/v1/completions", content=chunked()), 413)["code"] == "request_too_large"
        small = {"model": "tiny", "prompt": "x" * 100, "max_tokens": 1}
        assert http.post("/v1/completions", json=small).status_code == 503  # under the limit: through


def test_decode_full_is_a_503_with_retry_after_and_a_request_that_can_never_fit_a_400():
    from router.handoff import HandoffError

    full = from_dispatch(HandoffError("decode-0 has no free KV blocks", retryable=True))
    assert (full.status, full.code, full.headers) == (503, "no_capacity", {"Retry-After": "1"})
    assert from_dispatch(HandoffError("the prompt needs more blocks than decode-0 has")).status == 400


def test_an_internal_failure_shows_an_error_id_and_no_internals(caplog):
    secret = "Traceback (most recent call last):\n  File 'engine/x.py', line 3\nKeyError: 'kv_cache'"
    with caplog.at_level(logging.ERROR, logger="tandem.router"):
        error = from_dispatch(KeyError(secret))
    assert error.status == 500 and "kv_cache" not in error.message and "Traceback" not in error.message
    error_id = error.message.rsplit("error id ", 1)[1].rstrip(")")
    assert any(error_id in r.getMessage() and "kv_cache" in r.getMessage() for r in caplog.records)


def test_tandem_status_sends_the_admin_token_and_a_500_hides_the_internals(router, tmp_path, monkeypatch):
    from cluster.admin_token import write_token

    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path))
    with pytest.raises(AdminError, match="no admin token"):
        _admin(router.url, "/admin/status")
    with pytest.raises(AdminError, match="HTTP 403"):
        _admin(router.url, "/admin/status", token=KEY)
    write_token("127.0.0.2", router.port, "another server's")  # the same port on another address: not ours
    with pytest.raises(AdminError, match="no admin token"):
        _admin(router.url, "/admin/status")
    path = write_token(router.host, router.port, ADMIN)  # as `tandem serve` writes it
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
    with pytest.raises(AdminError, match="HTTP 500") as err:  # let in; the missing controller fails inside
        _admin(router.url, "/admin/status")
    assert "error id" in str(err.value) and "controller" not in str(err.value) and "Attribute" not in str(err.value)


def test_a_client_that_sends_its_whole_oversized_body_then_closes_reads_the_413(router):
    """As urllib does (Connection: close, the body sent before the answer is read): the router reads what is
    left of a body a few times the limit before it answers and closes, so the client gets the 413, not a reset."""
    for _ in range(5):
        with socket.create_connection((router.host, router.port)) as conn:
            body = b"x" * (3 * BODY_LIMIT)
            conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                         b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: %d\r\n\r\n" % len(body))
            conn.sendall(body)
            reply = b""
            while chunk := conn.recv(65536):
                reply += chunk
        assert reply.startswith(b"HTTP/1.1 413"), reply[:100]


BUFFERED_BOUND = 100 * 1024  # room for one body of 60 KiB buffered at a time, not two


@pytest.fixture(scope="module")
def small_buffer_router(tiny_model_dirs):
    config = RouterConfig(tiny_model_dirs["llama"], "tiny", max_request_body_bytes=BODY_LIMIT,
                          max_buffered_body_bytes=BUFFERED_BOUND)  # fmt: skip
    server = RouterServer(create_app(config))
    yield server
    server.stop()


def _start_upload(router, body: bytes, pause_s: float = 0.0) -> socket.socket:
    """A client that declares its whole body and sends only its first half (a slow upload), `pause_s` after
    its headers."""
    conn = socket.create_connection((router.host, router.port))
    conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body))  # fmt: skip
    time.sleep(pause_s)
    conn.sendall(body[: len(body) // 2])
    return conn


def _reply(conn: socket.socket) -> bytes:
    conn.settimeout(10)
    reply = b""
    while chunk := conn.recv(65536):
        reply += chunk
    conn.close()
    return reply


def _upload_body() -> bytes:
    return b'{"model": "tiny", "prompt": "' + b"x" * (60 * 1024) + b'"}'


def test_bodies_buffered_at_once_are_bounded_and_released_when_done_or_abandoned(small_buffer_router):
    body = _upload_body()
    first = _start_upload(small_buffer_router, body)
    time.sleep(0.3)  # the router has taken the first body's bytes
    for pause_s in (0.0, 0.1):  # its bytes arrive with its headers, or just after the refusal was decided
        second = _reply(_start_upload(small_buffer_router, body, pause_s))  # read, not reset
        assert second.startswith(b"HTTP/1.1 503") and b"server_busy" in second and b"retry-after: 1" in second.lower()
    first.sendall(body[len(body) // 2 :])
    done = _reply(first)
    assert done.startswith(b"HTTP/1.1 400") and b"maximum context length" in done, done[:300]  # the app read it
    abandoned = _start_upload(small_buffer_router, body)
    time.sleep(0.3)
    abandoned.close()  # a client that leaves mid-body gives its bytes back
    time.sleep(0.3)
    again = _start_upload(small_buffer_router, body)
    again.sendall(body[len(body) // 2 :])
    assert _reply(again).startswith(b"HTTP/1.1 400")
