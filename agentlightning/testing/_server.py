"""``MockLLMServer``: a local OpenAI-compatible endpoint (chat, completions, Responses, models; and Anthropic's Messages
API at ``/v1/messages``, for ``anthropic.Anthropic(base_url=server.url)``)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from agentlightning._uvicorn import BackgroundServer
from agentlightning._wire import payloads
from agentlightning._wire.payloads import Choice, Reply
from agentlightning.testing._replies import MockReply, MockRequest, MockTokenizer, render_chat_prompt
from agentlightning.types import LLM

logger = logging.getLogger(__name__)

Handler = Callable[[MockRequest], "MockReply | str"]

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    429: "rate_limit_exceeded",
    500: "server_error",
    503: "service_unavailable",
}
# path under /v1 -> the body, the stream's events and their framing (Responses, Messages: named events, no [DONE])
_PAYLOADS: dict[str, tuple[Callable[[Reply], Any], Callable[[Reply], Iterator[dict[str, Any]]], dict[str, bool]]] = {
    "chat/completions": (payloads.chat_completion, payloads.chat_chunks, {}),
    "completions": (payloads.completion, payloads.completion_chunks, {}),
    "responses": (payloads.response_object, payloads.response_events, {"done": False, "named": True}),
    "messages": (payloads.message_object, payloads.message_events, {"done": False, "named": True}),
}


def echo_handler(request: MockRequest) -> MockReply:
    """The default rule: answer ``"echo: <last user message>"``."""
    return MockReply(content=f"echo: {request.last_user_text}")


class MockLLMServer:
    """A local OpenAI-compatible server for tests and offline agent development, with vLLM-style token ids and logprobs
    on request, and injected latency, HTTP errors and hangs (:class:`MockReply`)::

        with MockLLMServer(replies=[MockReply(content="SELECT 1")]) as server:
            client = openai.OpenAI(base_url=server.base_url, api_key="x")

    Give either ``handler`` (``MockRequest -> MockReply | str``, sync or async, called for every request) or
    ``replies`` (served in order; a request beyond the script gets an HTTP 500 saying so). With neither, replies
    echo the last user message. ``token_ids=True`` returns vLLM-style token ids on every response, as if each
    request had ``"return_token_ids": true``.
    """

    def __init__(
        self,
        handler: Handler | None = None,
        replies: Iterable[MockReply | str] | None = None,
        *,
        token_ids: bool = False,
        models: Sequence[str] = ("mock-model",),
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        if handler is not None and replies is not None:
            raise ValueError("MockLLMServer: give either handler= or replies=, not both")
        self.tokenizer = MockTokenizer()
        self.token_ids = token_ids
        self.models = list(models)
        self.host = host
        self.port = port  # the port listened on (known once started)
        self._lock = threading.Lock()
        self._requests: list[MockRequest] = []
        self._handler: Handler = echo_handler
        self._script: list[MockReply] | None = None
        self._script_position = 0
        self._hanging = 0
        if handler is not None:
            self.set_handler(handler)
        elif replies is not None:
            self.set_replies(replies)
        self._http: BackgroundServer | None = None
        self._stopping = asyncio.Event()

    def set_handler(self, handler: Handler) -> None:
        """Answer every following request with ``handler(request)``."""
        if not callable(handler):
            raise TypeError(f"MockLLMServer handler must be callable, got {type(handler).__name__}")
        with self._lock:
            self._handler, self._script = handler, None

    def set_replies(self, replies: Iterable[MockReply | str]) -> None:
        """Answer the following requests with ``replies``, in order (a str is ``MockReply(content=str)``)."""
        script = [_as_reply(reply, "replies") for reply in replies]
        with self._lock:
            self._script, self._script_position = script, 0

    @property
    def requests(self) -> list[MockRequest]:
        """The requests received so far, in order (a copy)."""
        with self._lock:
            return list(self._requests)

    @property
    def hanging(self) -> int:
        """How many requests hang now (``MockReply(hang=True)`` whose client is still connected)."""
        with self._lock:
            return self._hanging

    @property
    def url(self) -> str:
        """``http://host:port`` (no ``/v1``)."""
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, ``http://127.0.0.1:<port>/v1``."""
        return f"{self.url}/v1"

    def llm(self, model: str | None = None) -> LLM:
        """An ``agl.LLM`` pointing at this server."""
        return LLM(base_url=self.base_url, model=model or self.models[0], api_key="mock")

    def start(self) -> MockLLMServer:
        """Start listening (returns once the server accepts connections)."""
        if self._http is None:
            self._stopping = asyncio.Event()
            self._http = BackgroundServer(
                self._app(), self.host, self.port, name="MockLLMServer", timeout_graceful_shutdown=2
            ).start()
            self.port = self._http.port
        return self

    def stop(self) -> None:
        """Stop the server; hanging requests are released with a 503."""
        if self._http is None:
            return
        loop = self._http.loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed already
                loop.call_soon_threadsafe(self._stopping.set)
        self._http.stop(10)
        self._http = None

    def __enter__(self) -> MockLLMServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _app(self) -> Starlette:
        return Starlette(
            routes=[
                *(Route(f"/v1/{path}", self._serve, methods=["POST"]) for path in _PAYLOADS),
                Route("/v1/models", self._models, methods=["GET"]),
            ]
        )

    async def _models(self, _request: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"id": model, "object": "model", "created": 0, "owned_by": "agentlightning-mock"}
                    for model in self.models
                ],
            }
        )

    async def _serve(self, http_request: Request) -> Response:
        try:
            body = json.loads(await http_request.body())
        except json.JSONDecodeError as exc:
            return _error(400, f"request body is not JSON: {exc}")
        if not isinstance(body, dict):
            return _error(400, "request body must be a JSON object")
        request = MockRequest(path=http_request.url.path, body=body, headers=dict(http_request.headers))
        with self._lock:
            self._requests.append(request)
            index = len(self._requests) - 1
            scripted = None if self._script is None else self._next_scripted(index)
            handler = self._handler
        try:
            reply = scripted
            if reply is None:
                result = handler(request)
                reply = _as_reply(await result if inspect.isawaitable(result) else result, "handler result")
        except Exception as exc:  # a broken handler is reported to the client, not swallowed
            logger.exception("MockLLMServer handler failed on request #%d", index)
            return _error(500, f"MockLLMServer handler raised {type(exc).__name__}: {exc}")
        if reply.latency > 0:
            await asyncio.sleep(reply.latency)
        if reply.hang:
            return await self._hang(http_request)
        if reply.status >= 400:
            return _error(reply.status, reply.error_message or f"mock error {reply.status}")
        return self._respond(request, reply)

    async def _hang(self, http_request: Request) -> Response:
        """Answer nothing until the client leaves (its answer goes nowhere) or the server stops (a 503)."""
        with self._lock:
            self._hanging += 1
        try:
            while not self._stopping.is_set():
                if await http_request.is_disconnected():
                    return _error(499, "the client closed its connection while the request was hanging")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), 0.1)
            return _error(503, "MockLLMServer stopped while the request was hanging")
        finally:
            with self._lock:
                self._hanging -= 1

    def _next_scripted(self, index: int) -> MockReply:
        assert self._script is not None
        if self._script_position >= len(self._script):
            return MockReply(
                status=500,
                error_message=f"MockLLMServer: no scripted reply left for request #{index} "
                f"({len(self._script)} replies were scripted)",
            )
        self._script_position += 1
        return self._script[self._script_position - 1]

    def _respond(self, request: MockRequest, reply: MockReply) -> Response:
        body, chat = request.body, request.path.endswith(("/chat/completions", "/responses", "/messages"))
        tokenizer = self.tokenizer
        prompt = render_chat_prompt(request.messages, request.tools) if chat else request.messages[0]["content"]
        content = reply.content if chat else reply.completion_text()
        ids = tokenizer.encode(reply.completion_text())
        logprobs, top = None, body.get("top_logprobs")
        if body.get("logprobs"):  # chat: true; legacy completions: a count > 0
            logprobs = payloads.token_logprobs(
                [tokenizer.token_text(i) for i in ids],
                [tokenizer.logprob(i) for i in ids],
                top if isinstance(top, int) else 0,
            )
        choice = Choice(
            content=content,
            tool_calls=reply.openai_tool_calls() if chat else [],
            finish_reason=reply.resolved_finish_reason(),
            token_ids=ids,
            logprobs=logprobs,
            pieces=[(piece, len(tokenizer.encode(piece))) for piece in payloads.text_pieces(content or "")],
            reasoning=reply.reasoning if chat else None,
        )
        answer = Reply(
            model=request.model or self.models[0],
            choices=[choice] * int(body.get("n") or 1),
            prompt_token_ids=tokenizer.encode(prompt),
            token_ids=self.token_ids or bool(body.get("return_token_ids")),
        )
        whole, events, framing = _PAYLOADS[request.path.removeprefix("/v1/")]
        if not body.get("stream"):
            return JSONResponse(whole(answer))
        if request.path.endswith("/chat/completions"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return _sse(payloads.chat_chunks(answer, include_usage))
        return _sse(events(answer), **framing)


def _as_reply(value: Any, where: str) -> MockReply:
    if isinstance(value, MockReply):
        return value
    if isinstance(value, str):
        return MockReply(content=value)
    raise TypeError(f"MockLLMServer {where} must be a MockReply or str, got {type(value).__name__} {value!r}")


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": _ERROR_TYPES.get(status, "api_error"), "param": None, "code": None}},
        status_code=status,
    )


def _sse(events: Iterator[dict[str, Any]], **framing: bool) -> StreamingResponse:
    return StreamingResponse(payloads.sse(events, **framing), media_type="text/event-stream")
