"""The per-rollout OpenAI-compatible proxy: ``/rollouts/{rollout_id}/v1/{chat/completions,completions,responses}``.

Each request is checked against the rollout's state, forwarded upstream with ``return_token_ids`` (and logprobs
when the server trains with them), and recorded as a ``Call`` of the rollout with the exact token ids
(``token_source="server"``) and the model version served. Streams are passed through byte for byte while being
recorded. Upstream 5xx/429 and connection errors are retried with backoff while it is safe (before any byte
reached the agent); otherwise the upstream's answer is returned unchanged.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.responses import JSONResponse, StreamingResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from agentlightning._wire.read import ENDPOINTS, StreamFold, build_call, fill_answer, read_response, request_fields
from agentlightning.server.runtime import Runtime, Upstream
from agentlightning.server.upstream_http import (
    ConnectError,
    HttpxUpstreamClient,
    ReadTimeout,
    RemoteProtocolError,
    UpstreamClient,
    UpstreamHTTP,
    UpstreamResponse,
    env_proxy_for,
)
from agentlightning.server.worker_api import read_body
from agentlightning.types import new_id

logger = logging.getLogger(__name__)

CallRecord = dict[str, Any]  # the Call fields of a proxied call, filled in as its answer arrives

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
_RETRY_ERRORS = (ConnectError, RemoteProtocolError)


def openai_error(status: int, message: str, code: str, kind: str = "invalid_request_error") -> JSONResponse:
    """An error in the OpenAI format, which agents' clients turn into a readable exception."""
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": code}}, status_code=status)


class Proxy:
    """Forwards a rollout's LLM requests upstream and records them."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.client: UpstreamClient | None = None
        self._via_env_proxy: HttpxUpstreamClient | None = None
        self._env_proxied: dict[str, bool] = {}

    async def start(self) -> None:
        """Create the pooled upstream client (inside the server's event loop)."""
        self.client = UpstreamClient(timeout=self.runtime.settings.upstream_timeout, connect_timeout=10.0)

    async def close(self) -> None:
        """Close upstream connections."""
        if self.client is not None:
            await self.client.aclose()
        if self._via_env_proxy is not None:
            await self._via_env_proxy.aclose()

    def _client_for(self, upstream_url: str) -> UpstreamHTTP:
        """The lean client, or httpx for an upstream that the environment (``HTTPS_PROXY`` ...) routes through a
        proxy."""
        proxied = self._env_proxied.get(upstream_url)
        if proxied is None:
            proxied = self._env_proxied[upstream_url] = env_proxy_for(upstream_url) is not None
        if not proxied:
            assert self.client is not None, "proxy not started"
            return self.client
        if self._via_env_proxy is None:
            self._via_env_proxy = HttpxUpstreamClient(timeout=self.runtime.settings.upstream_timeout)
        return self._via_env_proxy

    async def handle(self, receive: Receive, rollout_id: str, path: str) -> ASGIApp:
        """Serve ``POST /rollouts/{rollout_id}/v1/{path}``: returns the answer to send."""
        endpoint = ENDPOINTS.get(path)
        if endpoint is None:
            return openai_error(404, f"unknown endpoint /v1/{path}: the proxy serves chat/completions, completions "
                                     "and responses", "unknown_endpoint")
        refusal, attempt = self._check_rollout(rollout_id)
        if refusal is not None:
            return refusal
        upstream = self.runtime.upstream
        if upstream is None:
            return openai_error(503, "no upstream model is configured on the server (agl server --upstream URL, "
                                     "or LightningServer.set_upstream)", "no_upstream", "server_error")
        try:
            raw = await read_body(receive)
            body = json.loads(raw)
        except ValueError as exc:
            return openai_error(400, f"request body is not valid JSON: {exc}", "invalid_json")
        if not isinstance(body, dict):
            return openai_error(400, f"request body must be a JSON object, got {type(body).__name__}", "invalid_json")
        call = {**request_fields(endpoint, body), "call_id": new_id("call"), "rollout_id": rollout_id,
                "status": "ok", "start_time": time.time()}
        call["metadata"].update(endpoint=endpoint, captured_by="proxy")
        if upstream.model_version is not None:
            call["metadata"]["model_version"] = upstream.model_version
        payload = _upstream_body(raw, body, endpoint, upstream)
        url = f"{upstream.url.rstrip('/')}/{path}"
        headers = {"content-type": "application/json", "accept-encoding": "identity"}
        if upstream.api_key:
            headers["authorization"] = f"Bearer {upstream.api_key}"
        client = self._client_for(upstream.url)
        if body.get("stream"):
            return await self._stream(client, url, headers, payload, call, attempt, endpoint)
        return await self._forward(client, url, headers, payload, call, attempt, endpoint)

    def _check_rollout(self, rollout_id: str) -> tuple[JSONResponse | None, int]:
        state = self.runtime.store.rollout_state(rollout_id)
        if state is None:
            return openai_error(404, f"unknown rollout {rollout_id!r}: this is not the LLM endpoint of any rollout on "
                                     "this server (use the llm.base_url given with the rollout)", "rollout_not_found"), 0
        status, attempt = state
        if status != "running":
            return openai_error(409, f"rollout {rollout_id!r} is {status}, not running: its LLM endpoint only "
                                     "serves the attempt that holds its lease", f"rollout_{status}"), attempt
        return None, attempt

    async def _send(
        self, client: UpstreamHTTP, url: str, headers: dict[str, str], payload: bytes, call: CallRecord, attempt: int,
        endpoint: str, stream: bool,
    ) -> tuple[UpstreamResponse | None, JSONResponse | None, int]:
        """POST upstream, retrying connection failures and retryable statuses with backoff. Returns (the answer
        to pass on, None, tries) or (None, the error answer, tries); an error status comes back already read."""
        settings = self.runtime.settings
        tries = 0
        while True:
            tries += 1
            try:
                response = await client.post(url, payload, headers, stream=stream)
                if stream and response.status_code >= 400:
                    await response.aread()
            except _RETRY_ERRORS as exc:
                if tries <= settings.upstream_retries:
                    await self._backoff(tries, None, endpoint, type(exc).__name__)
                    continue
                message = f"upstream {url} unreachable after {tries} tries: {type(exc).__name__}: {exc}"
                return None, self._failed(call, attempt, endpoint, 502, message, "upstream_unreachable"), tries
            except ReadTimeout as exc:
                message = f"upstream {url} did not answer within {settings.upstream_timeout} s ({type(exc).__name__})"
                return None, self._failed(call, attempt, endpoint, 504, message, "upstream_timeout"), tries
            if response.status_code in RETRY_STATUSES and tries <= settings.upstream_retries:
                await self._backoff(tries, response.header("retry-after"), endpoint, str(response.status_code))
                continue
            return response, None, tries

    async def _forward(
        self, client: UpstreamHTTP, url: str, headers: dict[str, str], payload: bytes, call: CallRecord, attempt: int,
        endpoint: str,
    ) -> ASGIApp:
        response, failure, tries = await self._send(client, url, headers, payload, call, attempt, endpoint, False)
        if response is None:
            assert failure is not None
            return failure
        call["end_time"] = time.time()
        call["metadata"]["upstream_tries"] = tries
        content = await response.aread()
        return _Answer(response.status_code, response.header("content-type") or "application/json", content,
                       lambda: self._record_body(call, attempt, endpoint, response.status_code, content))

    def _record_body(self, call: CallRecord, attempt: int, endpoint: str, status: int, content: bytes) -> None:
        """Runs on the event loop right after the answer was sent."""
        try:
            data = json.loads(content)
        except ValueError:
            data = None
        if status >= 400:
            call["status"] = "error"
            call["error"] = f"upstream HTTP {status}: {_error_message(data, content)}"
        elif isinstance(data, dict):
            fill_answer(call, read_response(endpoint, data), "server")
        self._record(call, attempt, endpoint)

    async def _stream(
        self, client: UpstreamHTTP, url: str, headers: dict[str, str], payload: bytes, call: CallRecord, attempt: int,
        endpoint: str,
    ) -> ASGIApp:
        response, failure, tries = await self._send(client, url, headers, payload, call, attempt, endpoint, True)
        if response is None:
            assert failure is not None
            return failure
        if response.status_code >= 400:
            content = await response.aread()
            call["end_time"] = time.time()
            return _Answer(response.status_code, response.header("content-type") or "application/json", content,
                           lambda: self._record_body(call, attempt, endpoint, response.status_code, content))
        call["metadata"]["upstream_tries"] = tries
        fold = StreamFold(endpoint)

        async def passthrough() -> AsyncIterator[bytes]:
            completed = False
            try:
                async for chunk in response.aiter_raw():
                    fold.feed(chunk)
                    yield chunk
                completed = True
            finally:
                await response.aclose()
                call["end_time"] = time.time()
                fill_answer(call, fold.answer(complete=completed), "server")
                if not completed:
                    call["status"] = "error"
                    call["error"] = "stream interrupted before the upstream finished"
                self._record(call, attempt, endpoint)

        return StreamingResponse(passthrough(), status_code=response.status_code,
                                 media_type=response.header("content-type") or "text/event-stream")

    def _failed(
        self, call: CallRecord, attempt: int, endpoint: str, status: int, message: str, code: str
    ) -> JSONResponse:
        call["end_time"] = time.time()
        call["status"] = "error"
        call["error"] = message
        self._record(call, attempt, endpoint)
        logger.warning("proxy for rollout %s: %s", call["rollout_id"], message)
        return openai_error(status, message, code, "upstream_error")

    async def _backoff(self, tries: int, retry_after: str | None, endpoint: str, reason: str) -> None:
        settings = self.runtime.settings
        delay = min(settings.retry_backoff * 2 ** (tries - 1), settings.retry_backoff_max)
        if retry_after is not None:
            try:
                delay = min(max(delay, float(retry_after)), settings.retry_backoff_max)
            except ValueError:
                pass
        self.runtime.metrics.inc("agl_proxy_upstream_retries_total", endpoint=endpoint, reason=reason)
        logger.info("upstream answered %s on %s; retrying in %.2f s (try %d)", reason, endpoint, delay, tries + 1)
        await asyncio.sleep(delay)

    def _record(self, call: CallRecord, attempt: int, endpoint: str) -> None:
        metrics = self.runtime.metrics
        metrics.inc("agl_proxy_calls_total", endpoint=endpoint, status=call["status"])
        if call.get("end_time") is not None:
            metrics.observe("agl_proxy_call_seconds", call["end_time"] - call["start_time"], endpoint=endpoint)
        try:
            self.runtime.store.record_proxy_call(build_call(call).model_dump(mode="json"), attempt)
        except Exception:  # recording must never break the agent's call
            logger.exception("could not record proxy call of rollout %s", call["rollout_id"])


class _Answer:
    """A buffered upstream answer passed on as is; ``then`` runs once the agent has it (recording the call)."""

    __slots__ = ("status", "headers", "content", "then")

    def __init__(self, status: int, media_type: str, content: bytes, then: Callable[[], None]) -> None:
        self.status = status
        self.headers = [(b"content-type", media_type.encode("latin-1")),
                        (b"content-length", str(len(content)).encode())]
        self.content = content
        self.then = then

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
            await send({"type": "http.response.body", "body": self.content})
        finally:  # recorded even when the agent went away meanwhile
            self.then()


def _upstream_body(raw: bytes, body: dict[str, Any], endpoint: str, upstream: Upstream) -> bytes:
    """The request as sent upstream: served model name, token ids requested, logprobs when training wants them.

    When the request only lacks keys (the usual case: the agent names the served model and does not ask for token
    ids), they are appended to the agent's bytes instead of serialising the whole conversation again."""
    additions = _missing_keys(body, endpoint, upstream)
    text = raw.rstrip()
    if additions is not None and body and raw.lstrip()[:1] == b"{" and text[-1:] == b"}":  # UTF-8 JSON object
        if not additions:
            return raw
        return text[:-1] + b"," + json.dumps(additions)[1:-1].encode() + b"}"
    payload = dict(body)
    if upstream.model_name:
        payload["model"] = upstream.model_name
    payload["return_token_ids"] = True
    if upstream.logprobs:
        if endpoint == "chat.completions":
            payload["logprobs"] = True
        elif endpoint == "completions" and not payload.get("logprobs"):
            payload["logprobs"] = 1
    return json.dumps(payload).encode()


def _missing_keys(body: dict[str, Any], endpoint: str, upstream: Upstream) -> dict[str, Any] | None:
    """The keys :func:`_upstream_body` would set, if ``body`` has none of them with another value; else None."""
    wanted: dict[str, Any] = {"return_token_ids": True}
    if upstream.model_name:
        wanted["model"] = upstream.model_name
    if upstream.logprobs:
        if endpoint == "chat.completions":
            wanted["logprobs"] = True
        elif endpoint == "completions" and not body.get("logprobs"):
            wanted["logprobs"] = 1
    missing = {}
    for key, value in wanted.items():
        if key not in body:
            missing[key] = value
        elif body[key] != value or type(body[key]) is not type(value):
            return None
    return missing


def _error_message(data: Any, content: bytes) -> str:
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        return str(data["error"].get("message"))
    return content[:500].decode(errors="replace")
