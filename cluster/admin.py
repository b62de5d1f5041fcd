"""Admin endpoints on the router's app: what `tandem scale` and `tandem status` call.

    POST /admin/scale   {"prefill": 2, "decode": 1}   (either may be left out) -> the status below
    GET  /admin/status  pools (size, TP, workers: node, load, restarts), Ray nodes, recent events

They listen where the API does (127.0.0.1 by default). Scaling blocks until
added workers serve and removed ones have drained, so it runs on a thread,
never on the router's event loop (which must keep syncing membership meanwhile).
"""

from __future__ import annotations

import asyncio

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field

from cluster.spec import SpecError
from router.errors import APIError


class ScaleRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prefill: int | None = Field(None, ge=0)
    decode: int | None = Field(None, ge=1)


def install_admin_routes(app: FastAPI) -> None:
    """Routes onto `app.state.controller`, a `ControllerClient` (set before the first admin call)."""
    def controller():
        return app.state.controller

    @app.post("/admin/scale", tags=["admin"])
    async def scale(body: ScaleRequest):
        try:
            await asyncio.to_thread(controller().scale, {"prefill": body.prefill, "decode": body.decode})
        except SpecError as err:
            raise APIError(400, str(err), code="invalid_scale") from None
        return await asyncio.to_thread(controller().status)

    @app.get("/admin/status", tags=["admin"])
    async def status():
        return await asyncio.to_thread(controller().status)
