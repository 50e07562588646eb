"""The worker protocol: ``POST /workers/{id}/dequeue`` (long poll), ``/rollouts/{id}/heartbeat`` and ``/result``.

A result upload is idempotent and only taken from the worker holding the attempt's lease; with ``?next=1`` its answer
also carries the worker's next lease (``"next"``). A re-sent result (its answer was lost) gets the same lease again
while the worker still holds it, after a server restart too: the store remembers which lease answered each result."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, field_validator

from agentlightning.protocol import Lease, proxy_path
from agentlightning.server._auth import rollout_key
from agentlightning.server._errors import LARGE_BODY, StrictJSONRoute
from agentlightning.server._runtime import Runtime
from agentlightning.types import LLM, Rollout


class ResultUpload(BaseModel):
    """Body of ``POST /rollouts/{id}/result``."""

    attempt: int = Field(ge=1, le=1000)  # as max_attempts; larger integers would not fit a SQLite row
    worker_id: str = Field(description="The worker holding the attempt's lease.")
    rollout: Rollout

    @field_validator("rollout")
    @classmethod
    def _finite_reward(cls, rollout: Rollout) -> Rollout:
        if rollout.final_reward is not None and not math.isfinite(rollout.final_reward):
            raise ValueError(f"final_reward must be a finite number, got {rollout.final_reward!r}")
        return rollout


class HeartbeatRequest(BaseModel):
    """Body of ``POST /rollouts/{id}/heartbeat``."""

    attempt: int = Field(ge=1, le=1000)
    worker_id: str


class LeaseAnswer(BaseModel):
    """A worker's next lease (None: nothing to do now), and whether it should exit."""

    lease: Lease | None = None
    stop: bool = False


def router(runtime: Runtime) -> APIRouter:
    """The worker protocol of ``runtime``'s server."""
    store, settings, metrics = runtime.store, runtime.settings, runtime.metrics
    routes = APIRouter(route_class=StrictJSONRoute, tags=["workers"])

    def leased(lease: Lease | None, counted: bool = True) -> Lease | None:
        """``lease`` given the rollout's model endpoint (the proxy URL of this server), counted unless it may be one
        handed again."""
        if lease is None:
            return None
        if counted:
            metrics.inc("agl_rollouts_leased_total")
        upstream = runtime.upstream
        lease.llm = LLM(
            base_url=f"{runtime.public_url or ''}{proxy_path(lease.rollout_id, lease.attempt)}",
            model=(upstream.model_name if upstream and upstream.model_name else "default"),
            api_key=rollout_key(runtime.token, lease.rollout_id) if runtime.token else "EMPTY",
            model_version=upstream.model_version if upstream else None,
        )
        return lease

    @routes.post("/workers/{worker_id}/dequeue")
    async def dequeue(worker_id: str, wait: float = 0.0) -> LeaseAnswer:
        deadline = time.monotonic() + max(0.0, min(wait, settings.dequeue_wait_max))
        while not runtime.stop_requested:
            woken = runtime.work_event()  # taken before looking at the queue: a wake-up meanwhile is not missed
            lease = leased(store.dequeue(worker_id, settings.lease_seconds))
            remaining = deadline - time.monotonic()
            if lease is not None or remaining <= 0:
                return LeaseAnswer(lease=lease)
            with contextlib.suppress(TimeoutError):  # looked at again within 0.5 s: a retry's delay may have passed
                await asyncio.wait_for(woken.wait(), min(remaining, 0.5))
        return LeaseAnswer(stop=True)

    @routes.post("/rollouts/{rollout_id}/heartbeat")
    async def heartbeat(rollout_id: str, body: HeartbeatRequest) -> dict[str, Any]:
        verdict = store.heartbeat(rollout_id, body.attempt, body.worker_id, settings.lease_seconds)
        return {"ok": verdict == "ok", "message": verdict, "stop": runtime.stop_requested}

    @routes.post("/rollouts/{rollout_id}/result")
    async def result(
        request: Request,
        rollout_id: str,
        body: ResultUpload,
        take_next: Annotated[bool, Query(alias="next")] = False,
    ) -> JSONResponse:
        large = len(await request.body()) > LARGE_BODY  # (read already) stored on a thread: the loop keeps serving
        if body.rollout.rollout_id != rollout_id:
            raise HTTPException(422, f"result for {body.rollout.rollout_id!r} posted to rollout {rollout_id!r}")
        lease = None
        if take_next and not runtime.stop_requested:  # a re-sent result gets the lease its first answer carried
            args = (rollout_id, body.attempt, body.worker_id, body.rollout, settings.lease_seconds)
            if large:
                outcome, lease = await asyncio.to_thread(store.complete_and_dequeue, *args)
            else:
                outcome, lease = store.complete_and_dequeue(*args)
            lease = leased(lease, counted=not outcome.duplicate)
        elif large:
            outcome = await asyncio.to_thread(store.complete, rollout_id, body.attempt, body.worker_id, body.rollout)
        else:
            outcome = store.complete(rollout_id, body.attempt, body.worker_id, body.rollout)
        if outcome.accepted:
            metrics.inc("agl_results_total", status=body.rollout.status)
        if outcome.retried:
            runtime.notify_work()
        answer = outcome.model_dump(mode="json")
        if not take_next:
            return JSONResponse(answer)
        answer["next"] = LeaseAnswer(lease=lease, stop=lease is None and runtime.stop_requested).model_dump(mode="json")
        return JSONResponse(answer)

    return routes
