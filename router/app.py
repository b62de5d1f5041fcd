"""The router's FastAPI app: `create_app(config, registry)` wires every piece; the caller registers workers.

    app = create_app(RouterConfig(model_dir=...), registry)
    registry.register("decode-0", "decode", control_endpoint(address)) # before or after start, on the app's loop
    serve(app, config)                                                # router.server

On startup the token stream binds and the periodic load refresh starts; on
shutdown both stop after the aborts already sent have been delivered.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.routing import Match

from router.api_models import (ChatCompletionRequest, ChatCompletionResponse, CompletionRequest, CompletionResponse,
                               ErrorResponse, ModelCard, ModelList)  # fmt: skip
from router.chat import create_chat_completion
from router.completions import create_completion
from router.config import RouterConfig
from router.dispatch import Dispatcher
from router.errors import APIError, install_error_handlers
from router.http_guard import RequestGuard, allowed_hosts_for
from router.metrics import RouterMetrics
from router.policy import make_pool_policies
from router.registry import WorkerRegistry
from router.served_model import ServedModel
from router.serving import Admission, RequestRunner
from router.token_stream import TokenStreamConsumer
from router.tokenize_api import install_tokenize_routes
from router.watchdog import watch

_ERRORS = {status: {"model": ErrorResponse} for status in (400, 401, 404, 413, 429, 500, 503)}


@dataclass
class RouterState:
    """Everything one app owns, for whoever embeds it (the cluster controller, tests)."""

    config: RouterConfig
    registry: WorkerRegistry
    dispatcher: Dispatcher
    runner: RequestRunner
    metrics: RouterMetrics
    created: int = 0

    def ready(self) -> bool:
        """A request can be served: a decode worker takes new requests (it prefills them itself while no
        prefill worker can, `router.local_prefill`)."""
        return bool(self.registry.pickable("decode"))

    def check_ready(self) -> None:
        """Raise the 503 (OpenAI's error format) that /health and /v1/models answer before `ready()`, and once
        admission is closed (the server is draining: load balancers stop sending)."""
        self.runner.admission.check_open()
        if not self.ready():
            raise APIError(503, "not ready: no decode worker is alive", code="no_live_worker")


def create_app(config: RouterConfig, registry: WorkerRegistry | None = None) -> FastAPI:
    options = dict(config.routing_options)
    registry = registry or WorkerRegistry(*make_pool_policies(config.routing_policy, options,
                                                              options.get("block_size", 16), config.colocated))
    registry.judge_by(config.liveness)  # also a registry the cluster built: the config says how workers are judged
    stream = TokenStreamConsumer(config.stream_address, config.cluster_key, registry.sender_name)
    metrics = RouterMetrics(registry)
    dispatcher = Dispatcher(registry, stream, config.colocated, config.handoff, config.max_resumes,
                            config.local_prefill, lambda reason: metrics.local_prefills.labels(reason).inc(),
                            config.max_predicted_ttft_s)  # fmt: skip
    admission = Admission(config.max_in_flight, config.retry_after_s)
    metrics.in_flight.set_function(lambda: admission.in_use)
    runner = RequestRunner(dispatcher, ServedModel(config), admission, metrics, config.limits,
                           config.connections.max_stream_backlog_bytes)  # fmt: skip
    state = RouterState(config, registry, dispatcher, runner, metrics, int(time.time()))

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        await stream.start()
        tasks = [asyncio.create_task(registry.keep_loads_fresh(config.load_refresh_s, config.worker_call_timeout_s))]
        if config.no_token_timeout_s > 0:
            tasks.append(asyncio.create_task(watch(dispatcher, config.no_token_timeout_s)))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await dispatcher.drain_aborts()
            await stream.close()

    # The router's metrics are Prometheus' (/metrics); FastAPI's own OpenTelemetry hooks would cost every request.
    app = FastAPI(title="Tandem", summary="OpenAI-compatible API of a disaggregated LLM server", lifespan=lifespan,
                  telemetry={"tracing": False, "metrics": False, "logs": False})  # fmt: skip
    app.state.router = state
    install_error_handlers(app)
    hosts = allowed_hosts_for(config.host, config.allowed_hosts)
    app.add_middleware(RequestGuard, api_key=config.api_key, max_body_bytes=config.max_request_body_bytes,
                       admin_token=config.admin_token, allowed_hosts=hosts,
                       max_buffered_bytes=config.max_buffered_body_bytes)  # fmt: skip
    app.add_middleware(_StatusCounter, metrics=metrics)  # added last: runs first, so it counts 401 and 413 too

    # Handlers return JSONResponse (no second validation of the body); the models document it.
    @app.post("/v1/completions", responses={200: {"model": CompletionResponse}, **_ERRORS})
    async def completions(body: CompletionRequest, request: Request):
        return await create_completion(body, runner, request)

    @app.post("/v1/chat/completions", responses={200: {"model": ChatCompletionResponse}, **_ERRORS})
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return await create_chat_completion(body, runner, request)

    # As vLLM's server, which is not up before its engine: a client polling /v1/models for readiness
    # gets 503 until a request can be served.
    @app.get("/v1/models", response_model=ModelList, responses={503: {"model": ErrorResponse}})
    async def models():
        state.check_ready()
        card = ModelCard(id=runner.model.name, created=state.created, max_model_len=runner.model.max_model_len)
        return ModelList(data=[card])

    install_tokenize_routes(app, runner.model)

    @app.get("/health", responses={503: {"model": ErrorResponse}})
    async def health():
        state.check_ready()
        return {"status": "ok"}

    @app.get("/metrics", include_in_schema=False)
    async def prometheus():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


class _StatusCounter:
    """Pure ASGI middleware (streams pass through untouched): counts each response's status by endpoint.

    The endpoint label is the route's template, and every path no route serves is one label ("unmatched"):
    labelling the raw path would let any client grow /metrics without bound."""

    def __init__(self, app, metrics: RouterMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def counting_send(message):
            if message["type"] == "http.response.start":
                self.metrics.http.labels(_endpoint(scope), str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counting_send)


def _endpoint(scope) -> str:
    """The template of the route that serves this request's path (any method), or "unmatched"."""
    for route in scope["app"].router.routes:
        match, _ = route.matches(scope)
        if match is not Match.NONE:  # PARTIAL: the path, another method (a 405 on that route)
            return route.path
    return "unmatched"
