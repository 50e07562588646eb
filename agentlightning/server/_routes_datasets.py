"""``/datasets``: upload (JSONL, or a JSON object with the records), list, show, tasks, attach."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, HTTPException, Request, Response
from pydantic import BaseModel, ValidationError

from agentlightning.protocol import DatasetInfo
from agentlightning.server._runtime import Runtime


class DatasetUpload(BaseModel):
    """A ``POST /datasets`` body sent as JSON (JSONL bodies are the records, one a line)."""

    records: list[Any]
    dataset_id: str | None = None
    name: str | None = None


def parse_upload(raw: bytes, content_type: str) -> DatasetUpload:
    """The upload in a JSON object or JSONL body; a 400 naming the first problem otherwise."""
    if "json" in content_type and "ndjson" not in content_type and "jsonl" not in content_type:
        try:
            return DatasetUpload.model_validate_json(raw)
        except ValidationError as exc:
            raise HTTPException(400, 'dataset body must be {"records": [...], "dataset_id"?: str, "name"?: str}: '
                                f"{'.'.join(map(str, exc.errors()[0]['loc']))}: {exc.errors()[0]['msg']}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HTTPException(400, f"dataset body is not UTF-8 text: {exc}") from None
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except ValueError as exc:
                raise HTTPException(400, f"dataset line {number} is not valid JSON: {exc}: {line[:80]!r}") from None
    return DatasetUpload(records=records)


def router(runtime: Runtime) -> APIRouter:
    """The dataset routes of ``runtime``'s server."""
    store = runtime.store
    routes = APIRouter(prefix="/datasets", tags=["datasets"])

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
