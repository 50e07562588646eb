"""The hot routes as plain ASGI handlers: the worker protocol (dequeue, heartbeat, result) and ``GET /stats``.

Every rollout costs the server a dequeue and a result upload besides its proxied calls, and drivers poll
``/stats``. FastAPI's routing, dependency solving and exception middleware cost more CPU than these handlers
themselves, so :func:`create_app` sends these paths here first. The JSON contract is FastAPI's: bodies validated by
the same pydantic models, errors answered as ``{"detail": "..."}`` with 404/409/422/400; auth and body-size limits
are applied by the middlewares in front of both.

``POST /rollouts/{id}/result?next=1`` also hands the uploading worker its next lease (``"next": {"lease", "stop"}``
in the answer, no waiting), saving the worker a dequeue request per rollout. If that answer is lost and the worker
re-sends the result, the re-send (a duplicate) gets the same lease again as long as it is still running, so a lost
answer does not leave a leased rollout without a worker until its lease expires.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections import OrderedDict
from typing import Any
from urllib.parse import parse_qsl

from fastapi import HTTPException
from pydantic import BaseModel, Field, ValidationError
from starlette.types import Receive, Scope, Send

from agentlightning.protocol import Lease
from agentlightning.server.runtime import Runtime
from agentlightning.server.states import InvalidTransition
from agentlightning.server.store import Conflict, NotFound, StoreError
from agentlightning.types import LLM, Rollout

logger = logging.getLogger(__name__)

_DEQUEUE_PATH = re.compile(r"^/workers/(?P<worker_id>[^/]+)/dequeue$")
_ROLLOUT_ACTION_PATH = re.compile(r"^/rollouts/(?P<rollout_id>[^/]+)/(?P<action>heartbeat|result)$")
_JSON_HEADERS = [(b"content-type", b"application/json")]
_HANDED_MAX = 4096  # workers whose last result-and-lease answer is remembered (for re-sent results)


class ResultUpload(BaseModel):
    """Body of ``POST /rollouts/{id}/result``."""

    attempt: int = Field(ge=1)
    worker_id: str | None = None
    rollout: Rollout


class HeartbeatRequest(BaseModel):
    """Body of ``POST /rollouts/{id}/heartbeat``."""

    attempt: int = Field(ge=1)
    worker_id: str


def validate_body(model: type[BaseModel], raw: bytes, path: str) -> Any:
    """``raw`` parsed as ``model``; a 422 naming the first bad fields otherwise."""
    try:
        return model.model_validate_json(raw or b"{}")
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc']) or 'body'}: {error['msg']}" for error in exc.errors()[:5]
        )
        raise HTTPException(422, f"invalid {model.__name__} for {path}: {problems}") from None


def store_error(exc: StoreError | InvalidTransition) -> HTTPException:
    """The HTTP answer to a store refusal."""
    if isinstance(exc, NotFound):
        return HTTPException(404, str(exc))
    if isinstance(exc, (Conflict, InvalidTransition)):
        return HTTPException(409, str(exc))
    return HTTPException(400, str(exc))


def lease_with_llm(runtime: Runtime, lease: Lease) -> Lease:
    """Fill in the rollout's model endpoint (the proxy URL of this server)."""
    upstream = runtime.upstream
    base = runtime.public_url or ""
    lease.llm = LLM(
        base_url=f"{base}/rollouts/{lease.rollout_id}/v1",
        model=(upstream.model_name if upstream and upstream.model_name else "default"),
        api_key=runtime.token or "EMPTY",
        model_version=upstream.model_version if upstream else None,
    )
    return lease


async def read_body(receive: Receive) -> bytes:
    """The whole request body."""
    message = await receive()
    body = message.get("body", b"")
    if not message.get("more_body", False):
        return body
    chunks = [body]
    while message.get("more_body", False):
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
    return b"".join(chunks)


async def send_json(send: Send, body: bytes, status: int = 200) -> None:
    """Answer with a JSON body."""
    await send({"type": "http.response.start", "status": status,
                "headers": [*_JSON_HEADERS, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class WorkerRoutes:
    """Serves the hot routes; :meth:`handle` says whether a request was one of them."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        # worker id -> ((rollout id, attempt) of its last result, the lease handed with the answer)
        self._handed: OrderedDict[str, tuple[tuple[str, int], Lease]] = OrderedDict()

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """Serve ``scope`` if it is a hot route; False leaves it to the application."""
        method = scope["method"]
        path = scope["path"]
        if method == "GET":
            if path != "/stats":
                return False
            call = self._stats()
        elif method != "POST":
            return False
        elif (match := _ROLLOUT_ACTION_PATH.match(path)) is not None:
            raw = await read_body(receive)
            if match["action"] == "result":
                call = self._result(match["rollout_id"], raw, path, scope["query_string"])
            else:
                call = self._heartbeat(match["rollout_id"], raw, path)
        elif (match := _DEQUEUE_PATH.match(path)) is not None:
            call = self._dequeue(match["worker_id"], scope["query_string"])
        else:
            return False
        try:
            body = await call
        except HTTPException as exc:
            await send_json(send, json.dumps({"detail": exc.detail}).encode(), exc.status_code)
        except Exception:
            logger.exception("%s %s failed", method, path)
            await send_json(send, b'{"detail":"internal server error"}', 500)
        else:
            await send_json(send, body)
        return True

    async def _stats(self) -> bytes:
        runtime = self.runtime
        return json.dumps({"rollouts": runtime.store.counts(), "stop_requested": runtime.stop_requested,
                           "attached": runtime.attached}).encode()

    async def _dequeue(self, worker_id: str, query: bytes) -> bytes:
        """Long poll for a lease: ``{"lease": {...} | null, "stop": bool}``."""
        runtime = self.runtime
        settings = runtime.settings
        wait = 0.0
        for name, value in _query(query):
            if name == "wait":
                try:
                    wait = float(value)
                except ValueError:
                    raise HTTPException(422, f"wait must be a number of seconds, got {value!r}") from None
        deadline = time.monotonic() + max(0.0, min(wait, settings.dequeue_wait_max))
        while True:
            if runtime.stop_requested:
                return b'{"lease":null,"stop":true}'
            woken = runtime.work_event()
            lease = self._lease(worker_id)
            if lease is not None:
                return _lease_answer(lease)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return b'{"lease":null,"stop":false}'
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), remaining)

    async def _heartbeat(self, rollout_id: str, raw: bytes, path: str) -> bytes:
        """``{"attempt", "worker_id"}`` -> ``{"ok", "message", "stop"}``."""
        body: HeartbeatRequest = validate_body(HeartbeatRequest, raw, path)
        runtime = self.runtime
        try:
            verdict = runtime.store.heartbeat(rollout_id, body.attempt, body.worker_id, runtime.settings.lease_seconds)
        except StoreError as exc:
            raise store_error(exc) from None
        return json.dumps({"ok": verdict == "ok", "message": verdict, "stop": runtime.stop_requested}).encode()

    async def _result(self, rollout_id: str, raw: bytes, path: str, query: bytes) -> bytes:
        """Store an attempt's result (idempotent); answers the :class:`ResultOutcome`, with ``"next"`` (the worker's
        next lease) when asked for with ``?next=1``."""
        body: ResultUpload = validate_body(ResultUpload, raw, path)
        if body.rollout.rollout_id != rollout_id:
            raise HTTPException(422, f"result for {body.rollout.rollout_id!r} posted to rollout {rollout_id!r}")
        take_next = any(name == "next" and value not in ("", "0", "false") for name, value in _query(query))
        if take_next and not body.worker_id:
            raise HTTPException(422, "next=1 needs the worker_id of the result: the next lease is that worker's")
        runtime = self.runtime
        result = (rollout_id, body.attempt)
        handed = self._handed.get(body.worker_id) if take_next and body.worker_id else None
        resent = handed is not None and handed[0] == result  # the answer to the first upload was lost
        lease: Lease | None = None
        try:
            if take_next and not resent and not runtime.stop_requested:
                assert body.worker_id is not None
                outcome, lease = runtime.store.complete_and_dequeue(
                    rollout_id, body.attempt, body.worker_id, body.rollout, runtime.settings.lease_seconds
                )
            else:
                outcome = runtime.store.complete(rollout_id, body.attempt, body.worker_id, body.rollout)
        except (StoreError, InvalidTransition) as exc:
            raise store_error(exc) from None
        if outcome.accepted:
            runtime.metrics.inc("agl_results_total", status=body.rollout.status)
        if outcome.retried:
            runtime.notify_work()
        answer = outcome.model_dump_json().encode()
        if not take_next:
            return answer
        assert body.worker_id is not None
        if lease is not None:
            runtime.metrics.inc("agl_rollouts_leased_total")
            lease = lease_with_llm(runtime, lease)
        elif resent and handed is not None:  # the same lease again, if the worker still holds it
            verdict = runtime.store.heartbeat(handed[1].rollout_id, handed[1].attempt, body.worker_id,
                                              runtime.settings.lease_seconds)
            lease = handed[1] if verdict == "ok" else self._lease(body.worker_id)
        return answer[:-1] + b',"next":' + self._next_answer(body.worker_id, result, lease) + b"}"

    def _next_answer(self, worker_id: str, result: tuple[str, int], lease: Lease | None) -> bytes:
        """The ``{"lease", "stop"}`` answer for a worker that reported ``result``, remembered for a re-send."""
        if lease is None:
            self._handed.pop(worker_id, None)
            return b'{"lease":null,"stop":true}' if self.runtime.stop_requested else b'{"lease":null,"stop":false}'
        self._handed[worker_id] = (result, lease)
        self._handed.move_to_end(worker_id)
        if len(self._handed) > _HANDED_MAX:
            self._handed.popitem(last=False)
        return _lease_answer(lease)

    def _lease(self, worker_id: str) -> Lease | None:
        runtime = self.runtime
        lease = runtime.store.dequeue(worker_id, runtime.settings.lease_seconds)
        if lease is None:
            return None
        runtime.metrics.inc("agl_rollouts_leased_total")
        return lease_with_llm(runtime, lease)


def _lease_answer(lease: Lease) -> bytes:
    return b'{"stop":false,"lease":' + lease.model_dump_json().encode() + b"}"


def _query(query: bytes) -> list[tuple[str, str]]:
    return parse_qsl(query.decode("latin-1"))
