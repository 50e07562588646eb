"""How the server answers errors.

The server's own API answers ``{"detail": "..."}`` (FastAPI's format; validation errors as one readable line).
What agents' OpenAI clients read (the proxy, auth, the body-size limit) is answered in the OpenAI error format,
which those clients turn into a readable exception.
"""

from __future__ import annotations

import typing

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from agentlightning.server._states import InvalidTransition
from agentlightning.server.store import Conflict, NotFound, StoreError


def openai_error(
    status: int, message: str, code: str | int, kind: str = "invalid_request_error",
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """An error answer in the OpenAI format."""
    error = {"message": message, "type": kind, "param": None, "code": code}
    return JSONResponse({"error": error}, status_code=status, headers=headers)


class OpenAIError(HTTPException):
    """Raised from a dependency or a body read to answer in the OpenAI format (an ``HTTPException``, so that
    FastAPI passes it on unchanged while it reads a body)."""

    def __init__(self, status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(status, message, headers)
        self.kind = kind


def store_error(exc: StoreError | InvalidTransition) -> HTTPException:
    """The HTTP answer to a store refusal: 404 unknown, 409 conflict, 400 otherwise."""
    if isinstance(exc, NotFound):
        return HTTPException(404, str(exc))
    if isinstance(exc, (Conflict, InvalidTransition)):
        return HTTPException(409, str(exc))
    return HTTPException(400, str(exc))


def add_error_handlers(app: FastAPI) -> None:
    """Answer :class:`OpenAIError` in the OpenAI format and validation errors as one ``detail`` line."""

    async def openai_format(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, OpenAIError)
        return openai_error(exc.status_code, str(exc.detail), exc.status_code, exc.kind, exc.headers)

    async def invalid(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        problems = "; ".join(f"{'.'.join(str(part) for part in error['loc'][1:]) or 'body'}: {error['msg']}"
                             for error in exc.errors()[:5])
        return JSONResponse({"detail": f"invalid {_body_model(request)} for {request.url.path}: {problems}"}, 422)

    app.add_exception_handler(OpenAIError, openai_format)
    app.add_exception_handler(RequestValidationError, invalid)


def _body_model(request: Request) -> str:
    """The name of the pydantic model the route's body is parsed as (``request`` for routes without one)."""
    route = request.scope.get("route")
    try:
        hints = typing.get_type_hints(route.endpoint) if route is not None else {}
    except NameError:
        hints = {}
    models = [hint.__name__ for name, hint in hints.items()
              if name != "return" and isinstance(hint, type) and issubclass(hint, BaseModel)]
    return models[0] if models else "request"
