"""The Lightning Server's HTTP API: one FastAPI router per resource, bearer-token auth (when a token is set: every
route but ``/health``, the API docs included; a rollout's proxy routes also take that rollout's own key), the
body-size limit and the background jobs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse

from agentlightning.server import _proxy, _routes_workers
from agentlightning.server._auth import bearer_token, rollout_access
from agentlightning.server._dashboard import add_server_dashboard
from agentlightning.server._errors import BodyLimitMiddleware, add_error_handlers
from agentlightning.server._routes import datasets_router, health_router, rollouts_router, status_router
from agentlightning.server._runtime import Runtime

logger = logging.getLogger(__name__)


def create_app(runtime: Runtime) -> FastAPI:
    """The server as an ASGI application: the routers, auth, the body-size limit and the background jobs."""
    _describe_metrics(runtime)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[dict[str, object]]:
        runtime.bind_loop(asyncio.get_running_loop())
        jobs = [asyncio.create_task(_reap_leases(runtime)), asyncio.create_task(_flush_periodically(runtime))]
        try:
            async with _proxy.upstream_client(runtime.settings.upstream_timeout) as upstream:
                yield {"upstream": upstream}  # request.state.upstream
        finally:
            for job in jobs:
                job.cancel()
            runtime.store.flush()

    open_docs = not runtime.token  # with a token, the docs are served behind it (_add_api_docs)
    app = FastAPI(
        title="Agent Lightning server",
        lifespan=lifespan,
        openapi_url="/openapi.json" if open_docs else None,
        docs_url="/docs" if open_docs else None,
        redoc_url="/redoc" if open_docs else None,
    )
    add_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=runtime.settings.max_body_bytes)
    auth = [Depends(bearer_token(runtime.token))] if runtime.token else []
    app.include_router(health_router(runtime))
    # The busiest routes first: a request is matched against the routes in order. A rollout's own LLM key opens
    # its proxy routes; everything else needs the server's token.
    proxy_auth = [Depends(rollout_access(runtime.token))] if runtime.token else []
    app.include_router(_proxy.router(runtime), dependencies=proxy_auth)
    for router in (_routes_workers.router, rollouts_router, datasets_router, status_router):
        app.include_router(router(runtime), dependencies=auth)
    add_server_dashboard(app, runtime, auth)
    if runtime.token:
        _add_api_docs(app, auth)
    return app


def _add_api_docs(app: FastAPI, auth: list[Any]) -> None:
    """FastAPI's ``/openapi.json``, ``/docs`` and ``/redoc``, behind the token like the API they describe."""

    @app.get("/openapi.json", include_in_schema=False, dependencies=auth)
    async def schema() -> JSONResponse:
        return JSONResponse(app.openapi())

    @app.get("/docs", include_in_schema=False, dependencies=auth)
    async def swagger() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title} - Swagger UI")

    @app.get("/redoc", include_in_schema=False, dependencies=auth)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url="/openapi.json", title=f"{app.title} - ReDoc")


class JobFailures:
    """How a background job that runs every few seconds logs failing: the first failure with its traceback, then
    one short line a minute while it goes on failing, and one line when it works again."""

    REPEAT_SECONDS = 60.0

    def __init__(self, job: str) -> None:
        self.job = job
        self._since: float | None = None  # monotonic time of the first failure in a row
        self._last_line = 0.0
        self._count = 0

    def failed(self, exc: Exception) -> None:
        now = time.monotonic()
        self._count += 1
        if self._since is None:
            self._since = self._last_line = now
            logger.exception("%s failed (retrying; one line a minute while it keeps failing)", self.job)
        elif now - self._last_line >= self.REPEAT_SECONDS:
            self._last_line = now
            logger.error("%s still failing (%d times in %.0f s): %s", self.job, self._count, now - self._since, exc)

    def succeeded(self) -> None:
        if self._since is not None:
            logger.warning("%s works again after %d failures", self.job, self._count)
            self._since, self._count = None, 0


async def _reap_leases(runtime: Runtime) -> None:
    """Give up on attempts whose worker stopped heart-beating (retried or failed per the rollout's attempts)."""
    interval = max(0.05, min(1.0, runtime.settings.lease_seconds / 4))
    failures = JobFailures("lease reaper")
    while True:
        await asyncio.sleep(interval)
        try:
            outcomes = runtime.store.expire_leases()
        except Exception as exc:
            failures.failed(exc)
            continue
        failures.succeeded()
        for outcome in outcomes:
            runtime.metrics.inc("agl_leases_expired_total")
            logger.warning("rollout %s: %s -> %s", outcome.rollout_id, outcome.message, outcome.status)
        if any(outcome.retried for outcome in outcomes):
            runtime.notify_work()


async def _flush_periodically(runtime: Runtime) -> None:
    failures = JobFailures("store flush")
    while True:
        await asyncio.sleep(runtime.settings.flush_interval)
        try:
            runtime.store.flush()
        except Exception as exc:
            failures.failed(exc)
            continue
        failures.succeeded()


def _describe_metrics(runtime: Runtime) -> None:
    metrics = runtime.metrics
    metrics.describe("agl_rollouts", "gauge", "Rollouts in the store by state.")
    metrics.describe("agl_rollouts_enqueued_total", "counter", "Rollouts enqueued.")
    metrics.describe("agl_rollouts_leased_total", "counter", "Leases handed to workers (attempts started).")
    metrics.describe("agl_results_total", "counter", "Results accepted, by reported status.")
    metrics.describe("agl_leases_expired_total", "counter", "Attempts whose worker stopped heart-beating.")
    metrics.describe("agl_proxy_calls_total", "counter", "LLM calls forwarded by the proxy, by endpoint and status.")
    metrics.describe("agl_proxy_call_seconds", "summary", "Proxied call duration including the upstream.")
    metrics.describe("agl_proxy_upstream_retries_total", "counter", "Upstream retries, by endpoint and reason.")
    metrics.add_gauges(lambda: [("agl_rollouts", {"status": s}, float(n)) for s, n in runtime.store.counts().items()])
