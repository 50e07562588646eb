"""The per-rollout LLM proxy: ``/rollouts/{rollout_id}/attempts/{attempt}/v1/{chat/completions,completions,
responses,messages}`` (a lease's ``llm.base_url``; ``/rollouts/{rollout_id}/v1/...`` serves the running attempt).

Each call is recorded under the attempt its URL names, so a worker whose lease expired keeps its calls: they join the
stored rollout only if its attempt's result is the one taken. Each request is forwarded upstream over the server's one
``httpx.AsyncClient`` (retried with backoff and jitter on 5xx/429 and connection errors for
``Settings.upstream_retry_window`` seconds until its first byte reached the agent, held while the upstream is paused;
streams passed through) and recorded as a ``Call`` of the rollout with the upstream's token ids and the model version
served, committed before the answer's end reaches the agent. Once nobody waits for an answer (the agent closed its
connection, or its attempt ended: a timed-out rollout) its request is never re-sent, and an answer still awaited is
given ``Settings.late_answer_grace`` seconds more (one landing then is recorded as usual), then given up: its upstream
connection closed and the call recorded as given up. A call's role (its base URL ``.../v1/roles/<role>``, the
``X-AGL-Role`` header, a ``model`` naming a role) picks its policy's route. Anthropic Messages requests (``messages``,
``messages/count_tokens``) are translated to chat completions for the upstream and back (``_wire/anthropic.py``), and
so are Responses requests when the upstream says so (``Upstream.translate_responses``, ``_wire/responses.py``;
``previous_response_id`` continues a response of the same attempt); the chat call, with its token ids, is what is
recorded.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import random
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Annotated, Any

import httpx
import pydantic_core
from fastapi import APIRouter, Path, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.background import BackgroundTask

from agentlightning._wire import anthropic, responses
from agentlightning._wire.messages import media_size
from agentlightning._wire.payloads import sse_event
from agentlightning._wire.read import ENDPOINTS, StreamFold, build_call, fill_answer, read_response, request_fields
from agentlightning.protocol import ROLE_HEADER
from agentlightning.server._errors import StrictJSONRoute, openai_error, parse_json
from agentlightning.server._runtime import Route, Runtime, Upstream
from agentlightning.types import FINISHED_STATUSES, new_id

logger = logging.getLogger(__name__)

CallRecord = dict[str, Any]  # the Call fields of a proxied call, filled in as its answer arrives
AttemptNumber = Annotated[int, Path(ge=1, le=1000)]  # as max_attempts

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
WATCH_SECONDS = 1.0  # how often a request awaiting its upstream answer checks that its agent still waits for it
LARGE = 1 << 20  # bytes of an answer recorded on a thread: its SQLite write leaves the loop free


def upstream_client(timeout: float) -> httpx.AsyncClient:
    """The proxy's pooled upstream client (environment proxies honoured, as httpx does by default)."""
    return httpx.AsyncClient(
        timeout=httpx.Timeout(timeout, connect=10.0),
        limits=httpx.Limits(max_connections=1024, max_keepalive_connections=256),
    )


class Proxy:
    """Forwards a rollout's LLM requests upstream and records them."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    async def handle(
        self, client: httpx.AsyncClient, request: Request, rollout_id: str, attempt: int | None, path: str
    ) -> Response:
        """Serve ``POST /rollouts/{rollout_id}/attempts/{attempt}/v1/{path}`` (``attempt`` None: the rollout's running
        attempt, ``/rollouts/{rollout_id}/v1/{path}``) through ``client``."""
        url_role = None
        if path.startswith("roles/"):  # a role's own base URL, {llm.base_url}/roles/<role>
            url_role, _, path = path.removeprefix("roles/").partition("/")
        endpoint = "chat.completions" if path in ("messages", "messages/count_tokens") else ENDPOINTS.get(path)
        if endpoint is None:
            return openai_error(
                404,
                f"unknown endpoint /v1/{path}: the proxy serves chat/completions, completions, responses and messages",
                "unknown_endpoint",
            )
        if attempt is None:
            state = self.runtime.store.rollout_state(rollout_id)
            if state is None or state[0] != "running":
                return _not_serving(rollout_id, state)
            attempt = state[1]
        else:
            refusal = _not_serving_attempt(rollout_id, attempt, self.runtime.store.attempt_state(rollout_id, attempt))
            if refusal is not None:
                return refusal
        upstream = self.runtime.upstream
        if upstream is None:
            return openai_error(
                503,
                "no upstream model is configured on the server (agl server --upstream URL, "
                "or LightningServer.set_upstream)",
                "no_upstream",
                "server_error",
            )
        raw = await request.body()
        try:
            body = await parse_json(raw, "request body")
        except ValueError as exc:
            return openai_error(400, str(exc), "invalid_json")
        if not isinstance(body, dict):
            return openai_error(400, f"request body must be a JSON object, got {type(body).__name__}", "invalid_json")
        limit = self.runtime.settings.max_prompt_bytes
        if len(raw) > limit and (text := len(raw) - media_size(body)) > limit:
            message = (
                f"LLM request of {text} bytes of text (image and audio data not counted) is larger than the proxy's "
                f"limit of {limit} bytes (Settings.max_prompt_bytes, agl server --max-prompt-mb)"
            )
            return openai_error(413, message, "prompt_too_large")
        asked = body
        # Anthropic Messages always, Responses when the upstream asks for it: served as chat completions
        api = "messages" if path in ("messages", "messages/count_tokens") else None
        if path == "responses" and upstream.translate_responses:
            api, endpoint = "responses", "chat.completions"
        response_id = new_id("resp")
        if api == "messages":
            try:
                body = anthropic.chat_request(asked)
            except ValueError as exc:
                return openai_error(400, f"invalid Anthropic Messages request: {exc}", "invalid_request")
            if path == "messages/count_tokens":  # answered here: nothing is generated, nothing recorded
                return JSONResponse({"input_tokens": anthropic.count_tokens(body)})
        elif api == "responses":
            history = self._history(rollout_id, attempt, asked.get("previous_response_id"))
            if history is None:
                message = (
                    f"previous_response_id {asked.get('previous_response_id')!r} is not a response of rollout "
                    f"{rollout_id!r} (only this rollout's responses can be continued)"
                )
                return openai_error(400, message, "previous_response_not_found")
            try:
                body = responses.chat_request(asked, history)
            except ValueError as exc:
                return openai_error(400, f"invalid Responses request: {exc}", "invalid_request")
        role = url_role or request.headers.get(ROLE_HEADER)
        role = role or (body["model"] if upstream.route(body.get("model")) else None)
        route = upstream.route(role)  # an agent that cannot be instrumented may name its role in its URL or model
        call = {
            **request_fields(endpoint, body),
            "call_id": new_id("call"),
            "rollout_id": rollout_id,
            "role": role,
            "status": "ok",
            "start_time": time.time(),
        }
        call["metadata"].update(endpoint=endpoint, captured_by="proxy", attempt=attempt)
        if api is not None:  # recorded as the chat call sent upstream, streamed as the agent asked
            call["metadata"].update(api=api, stream=bool(asked.get("stream")))
        if api == "responses":
            call["metadata"].update(response_id=response_id, instructions=bool(asked.get("instructions")))
        version = route.model_version if route is not None else upstream.model_version
        if version is not None:
            call["metadata"]["model_version"] = version
        if route is not None and route.policy is not None:
            call["metadata"]["policy"] = route.policy
        headers = {"content-type": "application/json", "accept-encoding": "identity"}
        if upstream.api_key:
            headers["authorization"] = f"Bearer {upstream.api_key}"
        translator: anthropic.MessageStream | responses.ResponseStream | None = None
        if api is not None and asked.get("stream"):  # streamed upstream too: events reach the agent as made
            body = {**body, "stream": True, "stream_options": {"include_usage": True}}
            if api == "messages":
                translator = anthropic.MessageStream(asked.get("model"))
            else:
                translator = responses.ResponseStream(asked.get("model"), response_id)
        sent = client.build_request(
            "POST",
            f"{upstream.url.rstrip('/')}/{'chat/completions' if api else path}",
            headers=headers,
            content=json.dumps(_upstream_body(body, endpoint, upstream, route)).encode(),
        )
        stream = bool(body.get("stream"))
        response, tries = await self._send(client, sent, stream, call, attempt, request)
        if isinstance(response, JSONResponse):  # the upstream could not be reached
            return response
        call["metadata"]["upstream_tries"] = tries
        media_type = response.headers.get("content-type")
        if stream and response.status_code < 400:
            return StreamingResponse(
                self._pass_through(response, call, attempt, translator),
                response.status_code,
                media_type=media_type or "text/event-stream",
            )
        call["end_time"] = time.time()  # read whole by _send; recorded before the agent gets it
        # httpx's response and its stream refer to each other, so a large answer would stay in memory until the next
        # full collection (hundreds of MB after a few large calls): collected once the agent has it.
        collect = None
        if len(response.content) > LARGE:
            await asyncio.to_thread(self._record_answer, call, attempt, response.status_code, response.content)
            collect = BackgroundTask(gc.collect)
        else:
            self._record_answer(call, attempt, response.status_code, response.content)
        if api is not None and response.status_code < 400:  # a whole answer (streams were translated as they came)
            chat = json.loads(response.content)
            if api == "messages":
                return JSONResponse(anthropic.message_from_chat(chat, asked.get("model")), background=collect)
            return JSONResponse(responses.response_from_chat(chat, asked.get("model"), response_id), background=collect)
        return Response(
            response.content, response.status_code, media_type=media_type or "application/json", background=collect
        )

    async def _send(
        self,
        client: httpx.AsyncClient,
        request: httpx.Request,
        stream: bool,
        call: CallRecord,
        attempt: int,
        agent: Request,
    ) -> tuple[httpx.Response | JSONResponse, int]:
        """Send ``request``, retrying connection failures and retryable statuses with backoff and jitter for the retry
        window (held while the upstream is paused), but never re-sent once the ``agent`` left or its attempt ended.
        Returns the answer to pass on (read whole unless it is a stream) or the error to answer with, and the number
        of tries."""
        settings = self.runtime.settings
        endpoint = call["metadata"]["endpoint"]
        tries, deadline = 0, time.monotonic() + settings.upstream_retry_window
        last = ""  # what the previous try got
        while True:
            held = time.monotonic()
            while self.runtime.upstream_paused and time.monotonic() < held + settings.upstream_timeout:
                await asyncio.sleep(0.05)
            deadline += time.monotonic() - held  # a pause does not use up the window
            if tries and (gone := await self._gone(agent, call["rollout_id"], attempt)) is not None:
                message = f"upstream answer given up: {gone}, not re-sent after {tries} tries (the last: {last})"
                return self._failed(call, attempt, gone.status, message, "answer_given_up"), tries
            tries += 1
            try:
                response = await self._while_wanted(
                    agent, call["rollout_id"], attempt, _answer(client, request, stream)
                )
            except _GivenUp as exc:
                waited = "" if exc.waited is None else f" after {exc.waited:g} s"
                message = f"upstream answer given up: {exc}{waited}"
                return self._failed(call, attempt, exc.status, message, "answer_given_up"), tries
            except httpx.TimeoutException as exc:
                if not isinstance(exc, httpx.ConnectTimeout):
                    message = (
                        f"upstream {request.url} did not answer within {settings.upstream_timeout} s "
                        f"({type(exc).__name__})"
                    )
                    return self._failed(call, attempt, 504, message, "upstream_timeout"), tries
                failure: Exception = exc
            except httpx.TransportError as exc:
                failure = exc
            else:
                if response.status_code not in RETRY_STATUSES:
                    return response, tries
                await response.aclose()  # read whole already: its content stays
                status = str(response.status_code)
                said = last = f"{status} ({_error_message(response.content)[:200]})"
                if not await self._backoff(
                    tries, deadline, response.headers.get("retry-after"), endpoint, status, said
                ):
                    return response, tries  # the upstream's last answer, unchanged
                continue
            last = f"{type(failure).__name__}: {failure}"
            if not await self._backoff(tries, deadline, None, endpoint, type(failure).__name__):
                message = (
                    f"upstream {request.url} unreachable for {settings.upstream_retry_window:g} s ({tries} "
                    f"tries): {type(failure).__name__}: {failure}"
                )
                return self._failed(call, attempt, 502, message, "upstream_unreachable"), tries

    async def _while_wanted(
        self, agent: Request, rollout_id: str, attempt: int, work: Coroutine[Any, Any, httpx.Response]
    ) -> httpx.Response:
        """``work``'s result, checking every :data:`WATCH_SECONDS` that someone still waits for it. Once nobody does,
        it is given ``Settings.late_answer_grace`` seconds more (none when the server stops), then cancelled (closing
        its upstream connection: vLLM then aborts the generation and frees its slot) and :class:`_GivenUp` says why."""
        task = asyncio.create_task(work)
        try:
            gone = None
            while gone is None:
                done, _ = await asyncio.wait({task}, timeout=WATCH_SECONDS)
                if done:
                    return task.result()
                gone = await self._gone(agent, rollout_id, attempt)
            if self.runtime.shutting_down:  # no grace: the shutdown would cut it
                raise gone
            logger.info("proxy for rollout %s: %s; awaiting its upstream answer a while longer", rollout_id, gone)
            gone.waited = self.runtime.settings.late_answer_grace
            done, _ = await asyncio.wait({task}, timeout=gone.waited)
            if done:
                return task.result()
            raise gone
        finally:
            if not task.done():
                task.cancel()
                await asyncio.wait({task})

    async def _gone(self, agent: Request, rollout_id: str, attempt: int) -> _GivenUp | None:
        """Why nobody waits for this attempt's answer any more, or None while someone may."""
        if self.runtime.shutting_down:
            return _GivenUp("the server is stopping", 503)
        if await agent.is_disconnected():
            return _GivenUp("the agent closed its connection", 499)
        state = self.runtime.store.attempt_state(rollout_id, attempt)
        if _not_serving_attempt(rollout_id, attempt, state) is not None:
            ended = "unknown rollout" if state is None else state[1] or state[0]
            return _GivenUp(f"attempt {attempt} of rollout {rollout_id!r} ended ({ended})", 409)
        return None

    async def _pass_through(
        self,
        response: httpx.Response,
        call: CallRecord,
        attempt: int,
        translator: anthropic.MessageStream | responses.ResponseStream | None,
    ) -> AsyncIterator[bytes]:
        """The upstream's stream, chunk by chunk as it arrives (as ``translator``'s events, when given, for a
        translated request); recorded before its last event reaches the agent (or once it broke off)."""
        fold = StreamFold(call["metadata"]["endpoint"])
        recorded = closed = False

        def translated(chunks: list[Any], end: bool) -> bytes:
            nonlocal closed
            assert translator is not None
            events = [event for chunk in chunks if isinstance(chunk, dict) for event in translator.feed(chunk)]
            if end and not closed:
                closed = True
                events += translator.close()
            return b"".join(sse_event(event, named=True) for event in events)

        def record(completed: bool) -> None:
            nonlocal recorded
            recorded = True
            call["end_time"] = time.time()
            fill_answer(call, fold.answer(complete=completed), "server")
            self._record(call, attempt, None if completed else "stream interrupted before the upstream finished")

        try:
            async for chunk in response.aiter_bytes():
                chunks = fold.feed(chunk)
                end = b"data: [DONE]" in chunk or fold.final_response is not None
                if end:  # durable first
                    record(True)
                yield chunk if translator is None else translated(chunks, end)
            if not recorded:  # ended without [DONE]: whole only if the upstream said why it stopped
                record(fold.finish_reason is not None)
                if translator is not None and fold.finish_reason is not None:
                    yield translated([], True)
        finally:
            if not recorded:
                record(False)
            await response.aclose()

    def _history(self, rollout_id: str, attempt: int, previous: Any) -> list[dict[str, Any]] | None:
        """The chat messages of the translated response ``previous`` of this attempt of the rollout (its recorded
        call's input and answer); [] without one, None when no recorded call of the attempt answered it."""
        if previous is None:
            return []
        for recorded in reversed(self.runtime.store.proxy_calls(rollout_id, attempt)):
            if recorded.metadata.get("response_id") == previous and recorded.status == "ok":
                instructions = bool(recorded.metadata.get("instructions"))
                return responses.conversation(recorded.input or [], recorded.output or {}, instructions)
        return None

    def _record_answer(self, call: CallRecord, attempt: int, status: int, content: bytes) -> None:
        """Record a whole answer (runs right after the agent got it)."""
        try:
            data = pydantic_core.from_json(content)  # 2-3x faster than json on large answers
        except ValueError:
            data = None
        if status >= 400:
            self._record(call, attempt, f"upstream HTTP {status}: {_error_message(content)}")
            return
        if isinstance(data, dict):
            fill_answer(call, read_response(call["metadata"]["endpoint"], data), "server")
        self._record(call, attempt)

    def _failed(self, call: CallRecord, attempt: int, status: int, message: str, code: str) -> JSONResponse:
        call["end_time"] = time.time()
        self._record(call, attempt, message)
        logger.warning("proxy for rollout %s: %s", call["rollout_id"], message)
        return openai_error(status, message, code, "upstream_error")

    async def _backoff(
        self,
        tries: int,
        deadline: float,
        retry_after: str | None,
        endpoint: str,
        reason: str,
        said: str | None = None,
    ) -> bool:
        """Wait before the next try (False, without waiting, when that would pass ``deadline``). ``reason`` labels
        the retry metric (a status or an exception name); ``said``, logged instead, adds what the upstream said."""
        settings = self.runtime.settings
        delay = min(settings.retry_backoff * 2 ** (tries - 1), settings.retry_backoff_max) * random.uniform(0.5, 1.0)
        if retry_after is not None and retry_after.strip().replace(".", "", 1).isdigit():
            delay = max(delay, float(retry_after))
        if time.monotonic() + delay > deadline:
            return False
        self.runtime.metrics.inc("agl_proxy_upstream_retries_total", endpoint=endpoint, reason=reason)
        log = logger.warning if tries in (1, 10, 100) else logger.info
        log("upstream answered %s on %s; retrying in %.2f s (try %d)", said or reason, endpoint, delay, tries + 1)
        await asyncio.sleep(delay)
        return True

    def _record(self, call: CallRecord, attempt: int, error: str | None = None) -> None:
        if error is not None:
            call["status"], call["error"] = "error", error
        metrics, endpoint = self.runtime.metrics, call["metadata"]["endpoint"]
        metrics.inc("agl_proxy_calls_total", endpoint=endpoint, status=call["status"])
        if call.get("end_time") is not None:
            metrics.observe("agl_proxy_call_seconds", call["end_time"] - call["start_time"], endpoint=endpoint)
        try:
            built = build_call(call)
            metrics.inc("agl_proxy_completion_tokens_total", float(len(built.completion_token_ids or [])))
            self.runtime.store.record_proxy_call(built.model_dump(mode="json"), attempt)
        except Exception:  # recording must never break the agent's call
            logger.exception("could not record proxy call of rollout %s", call["rollout_id"])


class _GivenUp(Exception):
    """Nobody waits for an upstream answer any more: the message says why, ``status`` is answered (if anyone is
    there to read it)."""

    def __init__(self, reason: str, status: int) -> None:
        super().__init__(reason)
        self.status = status
        self.waited: float | None = None  # the grace its answer was awaited for after that, if any


async def _answer(client: httpx.AsyncClient, request: httpx.Request, stream: bool) -> httpx.Response:
    """The upstream's answer to ``request``: read whole, unless it is a stream that succeeded."""
    response = await client.send(request, stream=True)
    if stream and response.status_code < 400:
        return response
    try:
        await response.aread()
    finally:
        await response.aclose()  # cancelled while reading (given up): the upstream connection closes now
    return response


def router(runtime: Runtime) -> APIRouter:
    """The proxy's routes: each attempt's (``/rollouts/{rollout_id}/attempts/{attempt}/v1``, the ``llm.base_url`` of
    a lease) and the rollout's running attempt's (``/rollouts/{rollout_id}/v1``). The upstream client is the one the
    server's lifespan opened (``request.state``)."""
    routes = APIRouter(route_class=StrictJSONRoute, tags=["proxy"])
    proxy = Proxy(runtime)

    @routes.get("/rollouts/{rollout_id}/v1/models", response_model=None)
    @routes.get("/rollouts/{rollout_id}/v1/roles/{role}/models", response_model=None)
    @routes.get("/rollouts/{rollout_id}/attempts/{attempt}/v1/models", response_model=None)
    @routes.get("/rollouts/{rollout_id}/attempts/{attempt}/v1/roles/{role}/models", response_model=None)
    async def models(request: Request, rollout_id: str) -> dict[str, Any] | Response:
        state = runtime.store.rollout_state(rollout_id)
        if state is None:
            return _not_serving(rollout_id, state)
        upstream = runtime.upstream
        name = upstream.model_name if upstream and upstream.model_name else "default"
        if "anthropic-version" in request.headers:  # the Anthropic SDK's models.list: its page shape
            model = {"id": name, "type": "model", "display_name": name, "created_at": "1970-01-01T00:00:00Z"}
            return {"data": [model], "has_more": False, "first_id": name, "last_id": name}
        return {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "agentlightning"}]}

    @routes.post("/rollouts/{rollout_id}/attempts/{attempt}/v1/{path:path}")
    async def forward_attempt(request: Request, rollout_id: str, attempt: AttemptNumber, path: str) -> Response:
        return await proxy.handle(request.state.upstream, request, rollout_id, attempt, path)

    @routes.post("/rollouts/{rollout_id}/v1/{path:path}")
    async def forward(request: Request, rollout_id: str, path: str) -> Response:
        return await proxy.handle(request.state.upstream, request, rollout_id, None, path)

    return routes


def _not_serving(rollout_id: str, state: tuple[str, int] | None) -> JSONResponse:
    """404 for an unknown rollout, 409 for one that is not running."""
    if state is None:
        return openai_error(
            404,
            f"unknown rollout {rollout_id!r}: this is not the LLM endpoint of any rollout on "
            "this server (use the llm.base_url given with the rollout)",
            "rollout_not_found",
        )
    return openai_error(
        409,
        f"rollout {rollout_id!r} is {state[0]}, not running: its LLM endpoint only serves the "
        "attempt that holds its lease",
        f"rollout_{state[0]}",
    )


def _not_serving_attempt(rollout_id: str, attempt: int, state: tuple[str, str | None] | None) -> JSONResponse | None:
    """None when ``attempt`` may still call its LLM: it is running, or its lease expired but the rollout is not
    finished (its result may still be taken); else the 404 or 409 to answer."""
    if state is None or state[0] in FINISHED_STATUSES:
        return _not_serving(rollout_id, None if state is None else (state[0], attempt))
    if state[1] in ("running", "lease_expired"):
        return None
    ended = "was never leased" if state[1] is None else f"ended ({state[1]})"
    return openai_error(
        409,
        f"attempt {attempt} of rollout {rollout_id!r} {ended}: its LLM endpoint only serves an attempt that may "
        "still report a result",
        "attempt_ended",
    )


def _upstream_body(
    body: dict[str, Any], endpoint: str, upstream: Upstream, route: Route | None = None
) -> dict[str, Any]:
    """The request as sent upstream: served model name (the role's route's), token ids requested, sampling
    overrides, logprobs when training wants them."""
    payload = dict(body)
    if route is not None or upstream.model_name:
        payload["model"] = route.model_name if route is not None else upstream.model_name
    payload["return_token_ids"] = True
    payload.update(upstream.sampling_overrides)
    if upstream.max_tokens_limit is not None:
        _cap_max_tokens(payload, endpoint, upstream.max_tokens_limit)
    if upstream.logprobs:
        if endpoint == "chat.completions":
            payload["logprobs"] = True
        elif endpoint == "completions" and not payload.get("logprobs"):
            payload["logprobs"] = 1
    return payload


def _cap_max_tokens(payload: dict[str, Any], endpoint: str, limit: int) -> None:
    """At most ``limit`` tokens in the answer: the request's own limit if smaller, else ``limit``."""
    fields = {"responses": ("max_output_tokens",), "completions": ("max_tokens",)}
    names = fields.get(endpoint, ("max_completion_tokens", "max_tokens"))
    asked = [payload[name] for name in names if payload.get(name) is not None]
    if not all(type(value) is int for value in asked):
        return  # the backend refuses it with its own message
    for name in names:
        payload.pop(name, None)
    payload[names[0]] = min([limit, *asked])


def _error_message(content: bytes) -> str:
    """What an upstream's error answer says: its OpenAI-style ``error.message``, else the start of its body."""
    try:
        data = pydantic_core.from_json(content)
    except ValueError:
        data = None
    error = data.get("error") if isinstance(data, dict) else None
    return str(error.get("message")) if isinstance(error, dict) else content[:500].decode(errors="replace")
