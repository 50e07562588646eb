"""Server status: ``/health`` (open to probes), ``/stats``, ``/metrics`` (Prometheus text), ``/model``,
``/workers``, ``POST /stop``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse

from agentlightning.protocol import ModelVersion
from agentlightning.server._runtime import Runtime


def health_router(runtime: Runtime) -> APIRouter:
    """``GET /health``, served without a token (load balancers and probes do not carry one)."""
    routes = APIRouter(tags=["status"])

    @routes.get("/health")
    async def health() -> JSONResponse:  # 503 while the store cannot take writes
        problem = runtime.store.health()
        return JSONResponse({"status": "unhealthy" if problem else "ok", "store": problem or "ok",
                             "stop_requested": runtime.stop_requested}, 503 if problem else 200)

    return routes


def router(runtime: Runtime) -> APIRouter:
    """The status routes of ``runtime``'s server."""
    store = runtime.store
    routes = APIRouter(tags=["status"])

    @routes.get("/stats")
    async def stats() -> dict[str, Any]:
        return {"rollouts": store.counts(), "stop_requested": runtime.stop_requested, "attached": runtime.attached}

    @routes.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(runtime.metrics.render(), media_type="text/plain; version=0.0.4")

    @routes.get("/model")
    async def model() -> ModelVersion | None:
        return store.current_model()

    @routes.get("/workers")
    async def workers() -> list[dict[str, Any]]:
        return store.workers()

    @routes.post("/stop")
    async def stop() -> dict[str, Any]:
        runtime.request_stop()
        return {"stop_requested": True}

    return routes
