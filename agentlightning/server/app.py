"""The Lightning Server's HTTP API (FastAPI): datasets, rollout queue with leases, results, queries, proxy, health.

Routes (JSON unless said otherwise; every route but ``/health`` needs the bearer token when one is set):

- ``POST /datasets`` (JSONL body, or ``{"records": [...], "dataset_id": ..., "name": ...}``), ``GET /datasets``,
  ``GET /datasets/{id}``, ``GET /datasets/{id}/tasks``, ``POST /datasets/{id}/attach``
- ``POST /rollouts`` (enqueue ``{"dataset_id" | "tasks", "group_size", "group_id", "timeout", "max_attempts"}``),
  ``GET /rollouts`` (filters: status, task_id, group_id, dataset_id, limit, offset), ``GET /rollouts/{id}``,
  ``GET /rollouts/{id}/attempts``, ``GET /rollouts/{id}/proxy_calls``, ``POST /rollouts/{id}/cancel``
- worker protocol: ``POST /workers/{worker_id}/dequeue`` (long poll), ``POST /rollouts/{id}/heartbeat``,
  ``POST /rollouts/{id}/result`` (idempotent)
- proxy: ``POST /rollouts/{id}/v1/{chat/completions|completions|responses}``, ``GET /rollouts/{id}/v1/models``
- ``GET /health``, ``GET /metrics`` (Prometheus text), ``GET /stats``, ``GET /model``, ``GET /workers``,
  ``POST /stop``

The proxy, the worker protocol and ``/stats`` are served without FastAPI (see :mod:`agentlightning.server.worker_api`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from agentlightning.server.auth import AuthMiddleware
from agentlightning.server.limits import BodyLimitMiddleware
from agentlightning.server.proxy import Proxy
from agentlightning.protocol import Task
from agentlightning.server.runtime import Runtime
from agentlightning.protocol import task_id_for
from agentlightning.server.store import StoreError
from agentlightning.server.worker_api import WorkerRoutes, store_error, validate_body

logger = logging.getLogger(__name__)

_PROXY_PATH = re.compile(r"^/rollouts/(?P<rollout_id>[^/]+)/v1/(?P<path>.+)$")


class EnqueueRequest(BaseModel):
    """Body of ``POST /rollouts``."""

    dataset_id: str | None = None
    tasks: list[Any] | None = None
    group_size: int = Field(default=1, ge=1)
    group_id: str | None = None
    timeout: float | None = Field(default=None, gt=0)
    max_attempts: int | None = Field(default=None, ge=1)


def _json(model: BaseModel, status: int = 200) -> Response:
    return Response(model.model_dump_json(), status_code=status, media_type="application/json")


async def _parse(request: Request, model: type[BaseModel]) -> Any:
    return validate_body(model, await request.body(), request.url.path)


def parse_dataset_body(raw: bytes, content_type: str) -> tuple[list[Any], str | None, str | None]:
    """Records, dataset id and name from a ``POST /datasets`` body (JSON object or JSONL)."""
    text = raw.decode("utf-8", errors="strict") if raw else ""
    if "json" in content_type and "ndjson" not in content_type and "jsonl" not in content_type:
        try:
            body = json.loads(text)
        except ValueError as exc:
            raise HTTPException(400, f"dataset body is not valid JSON: {exc}") from None
        if not isinstance(body, dict) or not isinstance(body.get("records"), list):
            raise HTTPException(400, "dataset body must be {\"records\": [...], \"dataset_id\"?: str, \"name\"?: str}")
        return body["records"], body.get("dataset_id"), body.get("name")
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError as exc:
            raise HTTPException(400, f"dataset line {number} is not valid JSON: {exc}: {line[:80]!r}") from None
    return records, None, None


def create_app(runtime: Runtime) -> ASGIApp:
    """The server as an ASGI application (auth and body-size limits included)."""
    proxy = Proxy(runtime)
    store = runtime.store
    settings = runtime.settings
    metrics = runtime.metrics
    _describe_metrics(runtime)

    async def reap_leases() -> None:
        interval = max(0.05, min(1.0, settings.lease_seconds / 4))
        while True:
            await asyncio.sleep(interval)
            try:
                outcomes = store.expire_leases()
            except Exception:
                logger.exception("lease reaper failed")
                continue
            for outcome in outcomes:
                metrics.inc("agl_leases_expired_total")
                logger.warning("rollout %s: %s -> %s", outcome.rollout_id, outcome.message, outcome.status)
            if any(outcome.retried for outcome in outcomes):
                runtime.notify_work()

    async def flush_periodically() -> None:
        while True:
            await asyncio.sleep(settings.flush_interval)
            try:
                store.flush()
            except Exception:
                logger.exception("store flush failed")

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        runtime.bind_loop(asyncio.get_running_loop())
        await proxy.start()
        tasks = [asyncio.create_task(reap_leases()), asyncio.create_task(flush_periodically())]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await proxy.close()
            store.flush()

    app = FastAPI(title="Agent Lightning server", lifespan=lifespan)

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)

    # -- health and metrics -----------------------------------------------------------------------------------

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "stop_requested": runtime.stop_requested}

    @app.get("/metrics")
    async def metrics_text() -> PlainTextResponse:
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/model")
    async def model() -> Response:
        current = store.current_model()
        return JSONResponse(None) if current is None else _json(current)

    @app.get("/workers")
    async def workers() -> list[dict[str, Any]]:
        return store.workers()

    @app.post("/stop")
    async def stop() -> dict[str, Any]:
        runtime.request_stop()
        return {"stop_requested": True}

    # -- datasets --------------------------------------------------------------------------------------------

    @app.post("/datasets")
    async def upload_dataset(request: Request) -> Response:
        records, dataset_id, name = parse_dataset_body(await request.body(), request.headers.get("content-type", ""))
        dataset_id = request.query_params.get("dataset_id") or dataset_id
        name = request.query_params.get("name") or name
        try:
            info = store.add_dataset(records, dataset_id=dataset_id, name=name)
        except StoreError as exc:
            raise store_error(exc) from None
        return _json(info)

    @app.get("/datasets")
    async def list_datasets() -> list[dict[str, Any]]:
        return [info.model_dump() for info in store.list_datasets()]

    @app.get("/datasets/{dataset_id}")
    async def get_dataset(dataset_id: str) -> Response:
        info = store.get_dataset(dataset_id)
        if info is None:
            raise HTTPException(404, f"unknown dataset {dataset_id!r}")
        return _json(info)

    @app.get("/datasets/{dataset_id}/tasks")
    async def dataset_tasks(dataset_id: str) -> list[dict[str, Any]]:
        try:
            return [task.model_dump() for task in store.dataset_tasks(dataset_id)]
        except StoreError as exc:
            raise store_error(exc) from None

    @app.post("/datasets/{dataset_id}/attach")
    async def attach(dataset_id: str) -> dict[str, Any]:
        if store.get_dataset(dataset_id) is None:
            raise HTTPException(404, f"unknown dataset {dataset_id!r}: upload it first (POST /datasets)")
        runtime.attach(dataset_id)
        return {"attached": runtime.attached}

    # -- rollouts ------------------------------------------------------------------------------------------

    @app.post("/rollouts")
    async def enqueue(request: Request) -> dict[str, Any]:
        body: EnqueueRequest = await _parse(request, EnqueueRequest)
        if (body.dataset_id is None) == (body.tasks is None):
            raise HTTPException(422, "give exactly one of dataset_id or tasks")
        try:
            ids = enqueue_rollouts(runtime, body.dataset_id if body.tasks is None else body.tasks,
                                   group_size=body.group_size, group_id=body.group_id, timeout=body.timeout,
                                   max_attempts=body.max_attempts)
        except StoreError as exc:
            raise store_error(exc) from None
        return {"rollout_ids": ids}

    @app.get("/rollouts")
    async def list_rollouts(
        status: str | None = None,
        task_id: str | None = None,
        group_id: str | None = None,
        dataset_id: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[dict[str, Any]]:
        rows = store.list_rollouts(status=status, task_id=task_id, group_id=group_id, dataset_id=dataset_id,
                                   limit=max(1, min(limit, 10_000)), offset=max(0, offset))
        return [row.model_dump() for row in rows]

    @app.get("/rollouts/{rollout_id}")
    async def get_rollout(rollout_id: str) -> Response:
        rollout = store.get_rollout(rollout_id)
        if rollout is None:
            raise HTTPException(404, f"unknown rollout {rollout_id!r}")
        return _json(rollout)

    @app.get("/rollouts/{rollout_id}/attempts")
    async def attempts(rollout_id: str) -> list[dict[str, Any]]:
        if store.rollout_state(rollout_id) is None:
            raise HTTPException(404, f"unknown rollout {rollout_id!r}")
        return [attempt.model_dump() for attempt in store.attempts(rollout_id)]

    @app.get("/rollouts/{rollout_id}/proxy_calls")
    async def proxy_calls(rollout_id: str) -> list[dict[str, Any]]:
        if store.rollout_state(rollout_id) is None:
            raise HTTPException(404, f"unknown rollout {rollout_id!r}")
        return [call.model_dump(mode="json") for call in store.proxy_calls(rollout_id)]

    @app.post("/rollouts/{rollout_id}/cancel")
    async def cancel(rollout_id: str) -> Response:
        try:
            return _json(store.cancel(rollout_id))
        except StoreError as exc:
            raise store_error(exc) from None

    # -- proxy ----------------------------------------------------------------------------------------------

    @app.get("/rollouts/{rollout_id}/v1/models")
    async def models(rollout_id: str) -> Response:
        upstream = runtime.upstream
        name = upstream.model_name if upstream and upstream.model_name else "default"
        return JSONResponse({"object": "list", "data": [{"id": name, "object": "model", "owned_by": "agentlightning"}]})

    worker_routes = WorkerRoutes(runtime)

    async def dispatch(scope: Scope, receive: Receive, send: Send) -> None:
        """The hot paths (proxy, worker protocol, /stats) skip FastAPI's routing and dependency solving."""
        if scope["type"] == "http":
            if scope["method"] == "POST":
                match = _PROXY_PATH.match(scope["path"])
                if match is not None:
                    response = await proxy.handle(receive, match["rollout_id"], match["path"])
                    await response(scope, receive, send)
                    return
            if await worker_routes.handle(scope, receive, send):
                return
        await app(scope, receive, send)

    wrapped: ASGIApp = BodyLimitMiddleware(dispatch, settings.max_body_bytes)
    if runtime.token:
        wrapped = AuthMiddleware(wrapped, runtime.token)
    return wrapped


def enqueue_rollouts(
    runtime: Runtime,
    tasks_or_dataset: str | list[Any],
    *,
    group_size: int = 1,
    group_id: str | None = None,
    timeout: float | None = None,
    max_attempts: int | None = None,
) -> list[str]:
    """Queue ``group_size`` rollouts per task (a dataset id or a list of task payloads) and wake workers."""
    store = runtime.store
    dataset_id = None
    if isinstance(tasks_or_dataset, str):
        dataset_id = tasks_or_dataset
        tasks = store.dataset_tasks(dataset_id)
    else:
        for index, payload in enumerate(tasks_or_dataset):
            try:
                json.dumps(payload)
            except (TypeError, ValueError) as exc:
                raise StoreError(f"task {index} is not JSON-serialisable: {exc}") from None
        tasks = [Task(task_id=task_id_for(p, "task", i), payload=p) for i, p in enumerate(tasks_or_dataset)]
    ids = store.enqueue(
        tasks,
        group_size=group_size,
        group_id=group_id,
        dataset_id=dataset_id,
        timeout=timeout if timeout is not None else runtime.settings.rollout_timeout,
        max_attempts=max_attempts if max_attempts is not None else runtime.settings.max_attempts,
    )
    runtime.metrics.inc("agl_rollouts_enqueued_total", float(len(ids)))
    runtime.notify_work()
    return ids


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
