"""Running the router: `serve` blocks (uvicorn on uvloop); `RouterServer` runs it on a thread (tests, embedding).

The `tandem serve` CLI (cluster issue) builds a config and a registry, registers the
workers it started, and calls `serve`.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Callable

import uvicorn
from fastapi import FastAPI

from router.config import RouterConfig
from router.http_protocol import protocol_for
from runtime.serving_gc import tune_gc_for_serving


def _uvicorn(app: FastAPI) -> uvicorn.Server:
    """uvicorn for the app `router.app.create_app` made, its connections bounded by the app's config."""
    limits = app.state.router.config.connections
    config = uvicorn.Config(app, loop="uvloop", http=protocol_for(limits), ws="none", log_level="warning",
                            access_log=False, proxy_headers=False, timeout_graceful_shutdown=5)  # fmt: skip
    return uvicorn.Server(config)


def serve(app: FastAPI, config: RouterConfig) -> None:
    """Serve on config.host:config.port until interrupted (this process is the router's own)."""
    tune_gc_for_serving()
    server = _uvicorn(app)
    server.config.host, server.config.port = config.host, config.port
    server.run()


class RouterServer:
    """The app served on a background thread from a socket bound now (port 0: any free port)."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, start_timeout_s: float = 60.0):
        self.app = app
        self._sock = socket.create_server((host, port))
        self.host, self.port = self._sock.getsockname()[:2]
        self.url = f"http://{self.host}:{self.port}"
        self._server = _uvicorn(app)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, name="router", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + start_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the router did not start")
            time.sleep(0.01)

    def _run(self) -> None:
        import uvloop

        self._loop = uvloop.new_event_loop()
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._server.serve(sockets=[self._sock]))

    def call(self, fn: Callable[[], object], timeout_s: float = 30.0):
        """Run `fn()` on the router's event loop (e.g. `registry.register`) and return its result."""

        async def run():
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout_s)

    def stop(self, timeout_s: float = 30.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout_s)
        self._sock.close()
