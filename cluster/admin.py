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

from cluster.spec import ClusterSpec, SpecError
from router.errors import APIError


class ScaleRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prefill: int | None = Field(None, ge=0)
    decode: int | None = Field(None, ge=1)


def scale_bounds(spec: ClusterSpec) -> dict[str, tuple[int, int]]:
    """The sizes /admin/scale may set per pool: up to the spec's autoscale `max_replicas` (or its replicas,
    if more), and never a change of serving mode: a router started colocated (no prefill pool) keeps none,
    one started disaggregated keeps at least one prefill worker (with none it would answer 503 for good)."""

    def most(role: str) -> int:
        return max(spec.autoscale.pool(role).max_replicas, getattr(spec, role).replicas)

    prefill = (0, 0) if spec.prefill.replicas == 0 else (1, most("prefill"))
    return {"prefill": prefill, "decode": (1, most("decode"))}


def install_admin_routes(app: FastAPI, bounds: dict[str, tuple[int, int]]) -> None:
    """Routes onto `app.state.controller`, a `ControllerClient` (set before the first admin call); `bounds`:
    what each pool may be scaled to (`scale_bounds`)."""
    def controller():
        return app.state.controller

    @app.post("/admin/scale", tags=["admin"])
    async def scale(body: ScaleRequest):
        for role, size in (("prefill", body.prefill), ("decode", body.decode)):
            low, high = bounds[role]
            if size is not None and not low <= size <= high:
                raise APIError(400, f"{role} may be scaled to {low}..{high} workers here, not {size}", role,
                               code="invalid_scale")  # fmt: skip
        try:
            await asyncio.to_thread(controller().scale, {"prefill": body.prefill, "decode": body.decode})
        except SpecError as err:
            raise APIError(400, str(err), code="invalid_scale") from None
        return await asyncio.to_thread(controller().status)

    @app.get("/admin/status", tags=["admin"])
    async def status():
        return await asyncio.to_thread(controller().status)
