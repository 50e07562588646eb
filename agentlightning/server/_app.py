"""The Lightning Server's HTTP API: one FastAPI router per resource, bearer-token auth (every route but
``/health``, when a token is set), the body-size limit and the background jobs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import Depends, FastAPI

from agentlightning.server import _proxy, _routes_workers
from agentlightning.server._dashboard import add_server_dashboard
from agentlightning.server._errors import BodyLimitMiddleware, add_error_handlers, bearer_token
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

    app = FastAPI(title="Agent Lightning server", lifespan=lifespan)
    add_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=runtime.settings.max_body_bytes)
    auth = [Depends(bearer_token(runtime.token))] if runtime.token else []
    app.include_router(health_router(runtime))
    # The busiest routes first: a request is matched against the routes in order.
    for router in (_proxy.router, _routes_workers.router, rollouts_router, datasets_router, status_router):
        app.include_router(router(runtime), dependencies=auth)
    add_server_dashboard(app, runtime, auth)
    return app


async def _reap_leases(runtime: Runtime) -> None:
    """Give up on attempts whose worker stopped heart-beating (retried or failed per the rollout's attempts)."""
    interval = max(0.05, min(1.0, runtime.settings.lease_seconds / 4))
    while True:
        await asyncio.sleep(interval)
        try:
            outcomes = runtime.store.expire_leases()
        except Exception:
            logger.exception("lease reaper failed")
            continue
        for outcome in outcomes:
            runtime.metrics.inc("agl_leases_expired_total")
            logger.warning("rollout %s: %s -> %s", outcome.rollout_id, outcome.message, outcome.status)
        if any(outcome.retried for outcome in outcomes):
            runtime.notify_work()


async def _flush_periodically(runtime: Runtime) -> None:
    while True:
        await asyncio.sleep(runtime.settings.flush_interval)
        try:
            runtime.store.flush()
        except Exception:
            logger.exception("store flush failed")


def _describe_metrics(runtime: Runtime) -> None:
    metrics = runtime.metrics
    metrics.describe("agl_rollouts", "gauge", "Rollouts in the store by state.")
    metrics.describe("agl_rollouts_enqueued_total", "counter", "Rollouts enqueued.")
    metrics.describe("agl_rollouts_leased_total", "counter", "Leases handed to workers (attempts started).")
    metrics.describe("agl_results_total", "counter", "Results accepted, by reported status.")
    metrics.describe("agl_leases_expired_total", "counter", "Attempts whose worker stopped heart-beating.")
    metrics.describe("agl_proxy_calls_total", "counter", "LLM calls forwarded by the proxy, by endpoint and status.")
    metrics.describe("agl_proxy_call_seconds", "summary", "Proxied call duration including the upstream.")
    metrics.describe("agl_proxy_completion_tokens_total", "counter", "Completion tokens of the proxied LLM calls.")
    metrics.describe("agl_proxy_upstream_retries_total", "counter", "Upstream retries, by endpoint and reason.")
    metrics.add_gauges(lambda: [("agl_rollouts", {"status": s}, float(n)) for s, n in runtime.store.counts().items()])
