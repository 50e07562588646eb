"""The server's resource routers: ``/datasets`` (upload as JSONL or a JSON object with the records, list, show,
tasks, attach), ``/rollouts`` (enqueue, list, show, attempts, the proxy's call records, cancel) and status
(``/health``, open to probes; ``/stats``, ``/metrics`` in Prometheus text, ``/model``, ``/workers``, ``POST /stop``).
The worker protocol is in ``_routes_workers``, the proxy in ``_proxy``."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, Field, ValidationError

from agentlightning import _json
from agentlightning.protocol import AttemptInfo, DatasetInfo, ModelVersion, RolloutSummary
from agentlightning.server._errors import StrictJSONRoute
from agentlightning.server._runtime import Runtime
from agentlightning.server.store._browse import MAX_OFFSET


class DatasetUpload(BaseModel):
    """A ``POST /datasets`` body sent as JSON (JSONL bodies are the records, one a line)."""

    records: list[Any]
    dataset_id: str | None = None
    name: str | None = None


def parse_upload(raw: bytes, content_type: str) -> DatasetUpload:
    """The upload in a JSON object or JSONL body; a 400 naming the first problem otherwise."""
    if "json" in content_type and "ndjson" not in content_type and "jsonl" not in content_type:
        try:
            body = _json.loads(raw, "dataset body")
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None
        try:
            return DatasetUpload.model_validate(body)
        except ValidationError as exc:
            raise HTTPException(
                400,
                'dataset body must be {"records": [...], "dataset_id"?: str, "name"?: str}: '
                f"{'.'.join(map(str, exc.errors()[0]['loc']))}: {exc.errors()[0]['msg']}",
            ) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HTTPException(400, f"dataset body is not UTF-8 text: {exc}") from None
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                records.append(_json.loads(line, f"dataset line {number}"))
            except ValueError as exc:
                raise HTTPException(400, f"{exc}: {line[:80]!r}") from None
    return DatasetUpload(records=records)


def datasets_router(runtime: Runtime) -> APIRouter:
    """The dataset routes of ``runtime``'s server."""
    store = runtime.store
    routes = APIRouter(prefix="/datasets", route_class=StrictJSONRoute, tags=["datasets"])

    @routes.post("")
    async def upload(request: Request, dataset_id: str | None = None, name: str | None = None) -> Response:
        body = parse_upload(await request.body(), request.headers.get("content-type", ""))
        info = store.add_dataset(body.records, dataset_id=dataset_id or body.dataset_id, name=name or body.name)
        return Response(info.model_dump_json(), media_type="application/json")

    @routes.get("")
    async def list_datasets() -> list[DatasetInfo]:
        return store.list_datasets()

    @routes.get("/{dataset_id}")
    async def show(dataset_id: str) -> DatasetInfo:
        info = store.get_dataset(dataset_id)
        if info is None:
            raise HTTPException(404, f"unknown dataset {dataset_id!r}")
        return info

    @routes.get("/{dataset_id}/tasks")
    async def tasks(dataset_id: str) -> list[dict[str, Any]]:
        return [task.model_dump() for task in store.dataset_tasks(dataset_id)]

    @routes.post("/{dataset_id}/attach")
    async def attach(dataset_id: str) -> dict[str, Any]:
        if store.get_dataset(dataset_id) is None:
            raise HTTPException(404, f"unknown dataset {dataset_id!r}: upload it first (POST /datasets)")
        runtime.attach(dataset_id)
        return {"attached": runtime.attached}

    return routes


class EnqueueRequest(BaseModel):
    """Body of ``POST /rollouts``: exactly one of ``dataset_id`` and ``tasks``."""

    dataset_id: str | None = None
    tasks: list[Any] | None = None
    group_size: int = Field(default=1, ge=1, le=10_000)
    group_id: str | None = Field(default=None, max_length=256)
    timeout: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    max_attempts: int | None = Field(default=None, ge=1, le=1000)


def rollouts_router(runtime: Runtime) -> APIRouter:
    """The rollout routes of ``runtime``'s server."""
    store = runtime.store
    routes = APIRouter(prefix="/rollouts", route_class=StrictJSONRoute, tags=["rollouts"])

    def known(rollout_id: str) -> None:
        if store.rollout_state(rollout_id) is None:
            raise HTTPException(404, f"unknown rollout {rollout_id!r}")

    @routes.post("")
    def enqueue(body: EnqueueRequest) -> dict[str, list[str]]:  # on a thread: a large enqueue takes a while
        if (body.dataset_id is None) == (body.tasks is None):
            raise HTTPException(422, "give exactly one of dataset_id or tasks")
        source = body.dataset_id if body.tasks is None else body.tasks
        assert source is not None  # exactly one of them, as checked above
        ids = runtime.enqueue(
            source,
            group_size=body.group_size,
            group_id=body.group_id,
            timeout=body.timeout,
            max_attempts=body.max_attempts,
        )
        return {"rollout_ids": ids}

    @routes.get("")
    async def list_rollouts(
        status: str | None = None,
        task_id: str | None = None,
        group_id: str | None = None,
        dataset_id: str | None = None,
        limit: Annotated[int, Query(le=MAX_OFFSET)] = 100,
        offset: Annotated[int, Query(le=MAX_OFFSET)] = 0,
    ) -> list[RolloutSummary]:
        return store.list_rollouts(
            status=status,
            task_id=task_id,
            group_id=group_id,
            dataset_id=dataset_id,
            limit=max(1, min(limit, 10_000)),
            offset=max(0, offset),
        )

    @routes.get("/{rollout_id}")
    async def show(rollout_id: str) -> Response:
        rollout = store.get_rollout(rollout_id)
        if rollout is None:
            raise HTTPException(404, f"unknown rollout {rollout_id!r}")
        return Response(rollout.model_dump_json(), media_type="application/json")

    @routes.get("/{rollout_id}/attempts")
    async def attempts(rollout_id: str) -> list[AttemptInfo]:
        known(rollout_id)
        return store.attempts(rollout_id)

    @routes.get("/{rollout_id}/proxy_calls")
    async def proxy_calls(
        rollout_id: str, attempt: Annotated[int | None, Query(ge=1, le=1000)] = None
    ) -> list[dict[str, Any]]:
        known(rollout_id)
        return [call.model_dump(mode="json") for call in store.proxy_calls(rollout_id, attempt)]

    @routes.post("/{rollout_id}/cancel")
    async def cancel(rollout_id: str) -> Response:
        return Response(store.cancel(rollout_id).model_dump_json(), media_type="application/json")

    return routes


def health_router(runtime: Runtime) -> APIRouter:
    """``GET /health``, served without a token (load balancers and probes do not carry one)."""
    routes = APIRouter(route_class=StrictJSONRoute, tags=["status"])

    @routes.get("/health")
    async def health() -> JSONResponse:  # 503 while the store cannot take writes
        problem = runtime.store.health()
        return JSONResponse(
            {
                "status": "unhealthy" if problem else "ok",
                "store": problem or "ok",
                "stop_requested": runtime.stop_requested,
            },
            503 if problem else 200,
        )

    return routes


def status_router(runtime: Runtime) -> APIRouter:
    """The status routes of ``runtime``'s server."""
    store = runtime.store
    routes = APIRouter(route_class=StrictJSONRoute, tags=["status"])

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
