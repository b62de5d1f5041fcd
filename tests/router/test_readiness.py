"""Readiness: /health and /v1/models answer once a request can be served (a decode worker takes new ones).

A real router on loopback; the workers are fake endpoints registered on its loop, answering `load()`
(the router polls them as it polls real ones). Before it is ready, /v1/models answers 503 in OpenAI's
error format, as vLLM's server is not up before its engine is.
"""

from __future__ import annotations

import httpx
import pytest

from wire.requests import WorkerLoad
from router.app import create_app
from router.config import RouterConfig
from router.server import RouterServer


class FakeWorker:
    async def load(self) -> WorkerLoad:
        return WorkerLoad("fake", 0, 0, 0, 40, 40, 0.0)

    async def abort(self, request_id: str) -> None:
        pass


@pytest.fixture
def server(tiny_model_dirs):
    server = RouterServer(create_app(RouterConfig(tiny_model_dirs["llama"], "tiny")))
    yield server
    server.stop()


def _not_ready(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"]) == ("service_unavailable", "no_live_worker")


def test_models_and_health_answer_503_until_a_decode_worker_takes_requests(server):
    registry = server.app.state.router.registry
    with httpx.Client(base_url=server.url) as http:
        _not_ready(http.get("/v1/models"))
        _not_ready(http.get("/health"))
        server.call(lambda: registry.register("prefill-0", "prefill", FakeWorker()))
        _not_ready(http.get("/v1/models"))  # prefill alone serves nothing
        server.call(lambda: registry.register("decode-0", "decode", FakeWorker()))
        server.call(lambda: registry.drain("decode-0"))
        _not_ready(http.get("/v1/models"))  # a draining decode worker takes no new request
        server.call(lambda: registry.register("decode-1", "decode", FakeWorker()))
        assert [m["id"] for m in http.get("/v1/models").json()["data"]] == ["tiny"]
        assert http.get("/health").json() == {"status": "ok"}


def test_a_decode_worker_alone_is_ready_since_it_prefills_itself(server):
    registry = server.app.state.router.registry
    server.call(lambda: registry.register("decode-0", "decode", FakeWorker()))
    with httpx.Client(base_url=server.url) as http:
        assert http.get("/health").status_code == 200 and http.get("/v1/models").status_code == 200


def test_a_closed_admission_fails_health_and_refuses_new_requests_with_503(server):
    registry, admission = server.app.state.router.registry, server.app.state.router.runner.admission
    server.call(lambda: registry.register("decode-0", "decode", FakeWorker()))
    server.call(lambda: admission.close("the server is shutting down"))
    with httpx.Client(base_url=server.url) as http:
        for response in (http.get("/health"), http.get("/v1/models"),
                         http.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2})):
            assert response.status_code == 503, response.text
            error = response.json()["error"]
            assert (error["code"], error["message"]) == ("shutting_down", "the server is shutting down")
    assert admission.in_use == 0  # refused before anything was held
