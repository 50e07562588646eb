"""How the server answers errors: its own API in FastAPI's ``{"detail": "..."}`` format, and what agents' OpenAI
clients read (the proxy, auth, the body-size limit) in the OpenAI error format."""

from __future__ import annotations

import sqlite3

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from agentlightning.server._states import InvalidTransition
from agentlightning.server.store import Conflict, NotFound, StoreError, StoreUnavailable


def openai_error(status: int, message: str, code: str | int, kind: str = "invalid_request_error",
                 headers: dict[str, str] | None = None) -> JSONResponse:
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
    model."""

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
        problems = "; ".join(f"{'.'.join(str(part) for part in error['loc'][1:]) or 'body'}: {error['msg']}"
                             for error in exc.errors()[:5])
        return JSONResponse({"detail": f"invalid {model} for {request.url.path}: {problems}"}, 422)

    app.add_exception_handler(OpenAIError, openai_format)
    app.add_exception_handler(StoreError, refused)
    app.add_exception_handler(sqlite3.Error, refused)
    app.add_exception_handler(InvalidTransition, refused)
    app.add_exception_handler(RequestValidationError, invalid)
