"""``/rollouts``: enqueue, list, show, attempts, the proxy's call records, cancel."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Response
from pydantic import BaseModel, Field

from agentlightning.protocol import AttemptInfo, RolloutSummary
from agentlightning.server._runtime import Runtime


class EnqueueRequest(BaseModel):
    """Body of ``POST /rollouts``: exactly one of ``dataset_id`` and ``tasks``."""

    dataset_id: str | None = None
    tasks: list[Any] | None = None
    group_size: int = Field(default=1, ge=1, le=10_000)
    group_id: str | None = None
    timeout: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    max_attempts: int | None = Field(default=None, ge=1)


def router(runtime: Runtime) -> APIRouter:
    """The rollout routes of ``runtime``'s server."""
    store = runtime.store
    routes = APIRouter(prefix="/rollouts", tags=["rollouts"])

    def known(rollout_id: str) -> None:
        if store.rollout_state(rollout_id) is None:
            raise HTTPException(404, f"unknown rollout {rollout_id!r}")

    @routes.post("")
    def enqueue(body: EnqueueRequest) -> dict[str, list[str]]:  # on a thread: a large enqueue takes a while
        if (body.dataset_id is None) == (body.tasks is None):
            raise HTTPException(422, "give exactly one of dataset_id or tasks")
        ids = runtime.enqueue(body.dataset_id if body.tasks is None else body.tasks, group_size=body.group_size,
                              group_id=body.group_id, timeout=body.timeout, max_attempts=body.max_attempts)
        return {"rollout_ids": ids}

    @routes.get("")
    async def list_rollouts(
        status: str | None = None, task_id: str | None = None, group_id: str | None = None,
        dataset_id: str | None = None, limit: int = 100, offset: int = 0,
    ) -> list[RolloutSummary]:
        return store.list_rollouts(status=status, task_id=task_id, group_id=group_id, dataset_id=dataset_id,
                                   limit=max(1, min(limit, 10_000)), offset=max(0, offset))

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
    async def proxy_calls(rollout_id: str) -> list[dict[str, Any]]:
        known(rollout_id)
        return [call.model_dump(mode="json") for call in store.proxy_calls(rollout_id)]

    @routes.post("/{rollout_id}/cancel")
    async def cancel(rollout_id: str) -> Response:
        return Response(store.cancel(rollout_id).model_dump_json(), media_type="application/json")

    return routes
