"""How the server refuses requests (who may call it is ``_auth``): the body-size limit, JSON bodies read strictly
(:class:`StrictJSONRoute`), and its error answers: its own API in FastAPI's ``{"detail": "..."}`` format, and what
agents' OpenAI clients read (the proxy, auth, the body-size limit) in the OpenAI error format."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentlightning import _json
from agentlightning.errors import Conflict, InvalidTransition, NotFound, StoreError, StoreUnavailable

logger = logging.getLogger(__name__)


def openai_error(
    status: int,
    message: str,
    code: str | int,
    kind: str = "invalid_request_error",
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """An error answer in the OpenAI format."""
    error = {"message": message, "type": kind, "param": None, "code": code}
    return JSONResponse({"error": error}, status_code=status, headers=headers)


class OpenAIError(HTTPException):
    """Raised to answer in the OpenAI format (an ``HTTPException``, which FastAPI passes on while reading a body)."""

    def __init__(self, status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(status, message, headers)
        self.kind = kind


def add_error_handlers(app: FastAPI) -> None:
    """Answer :class:`OpenAIError` in the OpenAI format, store refusals as 404 (unknown), 409 (conflict) or 400, a
    store that cannot be written as 503 (retryable), and validation errors as one ``detail`` line naming the body's
    model. A client that left before its body was sent (killed mid-upload) is one log line, not a traceback."""

    async def openai_format(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, OpenAIError)
        return openai_error(exc.status_code, str(exc.detail), exc.status_code, exc.kind, exc.headers)

    async def refused(_request: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, (StoreUnavailable, sqlite3.Error)):
            return JSONResponse({"detail": f"store unavailable: {exc}"}, 503, headers={"retry-after": "5"})
        status = 404 if isinstance(exc, NotFound) else 409 if isinstance(exc, (Conflict, InvalidTransition)) else 400
        return JSONResponse({"detail": str(exc)}, status)

    async def invalid(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        body = getattr(request.scope.get("route"), "body_field", None)
        model = getattr(body.field_info.annotation, "__name__", "request") if body is not None else "request"
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc'][1:]) or 'body'}: {error['msg']}"
            for error in exc.errors()[:5]
        )
        return JSONResponse({"detail": f"invalid {model} for {request.url.path}: {problems}"}, 422)

    async def left(request: Request, _exc: Exception) -> Response:
        logger.warning(
            "%s %s: the client disconnected before its request body was sent (%s bytes announced); nothing was read",
            request.method,
            request.url.path,
            request.headers.get("content-length", "?"),
        )
        return Response(status_code=400)  # nobody reads it

    app.add_exception_handler(OpenAIError, openai_format)
    app.add_exception_handler(ClientDisconnect, left)
    for refusal in (StoreError, sqlite3.Error, InvalidTransition):
        app.add_exception_handler(refusal, refused)
    app.add_exception_handler(RequestValidationError, invalid)


class BodyLimitMiddleware:
    """Refuses a body larger than ``max_bytes`` with a 413 before anything parses it: at once when its
    ``Content-Length`` says so, else as soon as a handler has read that much. The rest of the body is read and dropped
    first (so the client sees the answer instead of a reset connection); none of it is kept."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self._drain(receive, {"more_body": True})
            refusal = self._refusal(declared.decode())
            answer = openai_error(refusal.status_code, str(refusal.detail), 413, refusal.kind, refusal.headers)
            await answer(scope, receive, send)
            return
        size = 0

        async def limited() -> Message:
            nonlocal size
            message = await receive()
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                await self._drain(receive, message)
                raise self._refusal(f"{size}+")
            return message

        await self.app(scope, limited, send)

    def _refusal(self, size: str) -> OpenAIError:
        message = (
            f"request body of {size} bytes is larger than the server's limit of {self.max_bytes} bytes "
            "(Settings.max_body_bytes, agl server --max-body-mb)"
        )
        return OpenAIError(413, message, "invalid_request_error", {"connection": "close"})

    @staticmethod
    async def _drain(receive: Receive, message: Message) -> None:
        while message.get("more_body", False):
            message = await receive()


LARGE_BODY = 1 << 20  # bytes of a body parsed (and its result stored) on a thread: the event loop keeps serving


async def parse_json(raw: bytes, what: str) -> Any:
    """:func:`agentlightning._json.loads` of ``raw``; on a thread when it is large."""
    if len(raw) > LARGE_BODY:
        return await asyncio.to_thread(_json.loads, raw, what)
    return _json.loads(raw, what)


class StrictJSONRequest(Request):
    """A request whose JSON body is read by :func:`agentlightning._json.loads`: text the store could not keep or
    answer with again (lone surrogates, NaN, numbers too large for a float, nesting past 200) is refused with a 422
    before any handler sees it."""

    _parsed: Any = None
    _was_parsed: bool = False

    async def json(self) -> Any:
        if not self._was_parsed:
            try:
                self._parsed = await parse_json(await self.body(), f"body of {self.method} {self.url.path}")
            except ValueError as exc:
                raise HTTPException(422, str(exc)) from None
            self._was_parsed = True
        return self._parsed


class StrictJSONRoute(APIRoute):
    """The route class of every router of the server: bodies are parsed by :class:`StrictJSONRequest`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return strict
