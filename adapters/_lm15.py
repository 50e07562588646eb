"""Capture of the requests DSPy's native engine sends (``dspy.LM`` with ``engine="auto"``, its default, or
``"lm15"``): its vendored lm15 library speaks HTTP through its own standard-library transports
(``StdlibTransport`` / ``StdlibAsyncTransport``), not through httpx or the openai client, so no other adapter sees
them. Inside a rollout each POST to an OpenAI-compatible endpoint becomes a ``Call`` read from the JSON body sent and
the body received (streamed or not; a stream closed early is recorded incomplete), with the server's token ids, and
the call's role goes to the proxy in the ``X-AGL-Role`` header (see ``_http``)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterator
from types import TracebackType
from typing import Any

import wrapt
from agentlightning.adapters._http import Answer, start_call
from dspy._vendor.lm15.transports import AsyncTransportResponse, TransportRequest, TransportResponse

from agentlightning.capture import LLMCall
from agentlightning.protocol import ROLE_HEADER

logger = logging.getLogger(__name__)

TRANSPORTS = "dspy._vendor.lm15.transports"


class HTTPStatusError(Exception):
    """What a call answered with an HTTP error status is recorded with (lm15 raises its own provider error)."""

    def __init__(self, message: str, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code


def _start(request: TransportRequest) -> LLMCall | None:
    call = start_call(request.method, request.url.split("?", 1)[0], request.body)
    if call is not None and (role := call.fields["role"]) is not None:
        request.headers.append((ROLE_HEADER, role))
    return call


def _answer(call: LLMCall, status: int) -> Answer:
    return Answer(call, status < 400, lambda text: HTTPStatusError(f"HTTP {status}: {text}", status))


class _ObservedResponse(wrapt.ObjectProxy):
    """A sync lm15 response whose body is recorded as the agent reads it (``read``, ``iter_lines``, iteration)."""

    def __init__(self, response: TransportResponse, answer: Answer) -> None:
        super().__init__(response)
        self._self_answer = answer

    def __enter__(self) -> _ObservedResponse:
        self.__wrapped__.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.__wrapped__.__exit__(*exc_info)
        self._self_answer.finish(complete=False)  # after the body was read through: nothing left to record

    def __iter__(self) -> Iterator[bytes]:
        yield from map(self._self_answer.add, self.__wrapped__)
        self._self_answer.finish()

    def read(self) -> bytes:
        return TransportResponse.read(self)  # type: ignore[arg-type]  # iterates through this proxy

    def iter_lines(self) -> Iterator[bytes]:
        return TransportResponse.iter_lines(self)  # type: ignore[arg-type]

    def close(self) -> None:
        self.__wrapped__.close()
        self._self_answer.finish(complete=False)


class _ObservedAsyncResponse(wrapt.ObjectProxy):
    """An async lm15 response whose body is recorded as the agent reads it."""

    def __init__(self, response: AsyncTransportResponse, answer: Answer) -> None:
        super().__init__(response)
        self._self_answer = answer

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for data in self.__wrapped__:
            yield self._self_answer.add(data)
        self._self_answer.finish()

    async def read(self) -> bytes:
        return await AsyncTransportResponse.read(self)  # type: ignore[arg-type]

    def aiter_lines(self) -> AsyncIterator[bytes]:
        return AsyncTransportResponse.aiter_lines(self)  # type: ignore[arg-type]

    async def aclose(self) -> None:
        await self.__wrapped__.aclose()
        self._self_answer.finish(complete=False)


class _ObservedStream:
    """What ``StdlibAsyncTransport.stream`` returns (awaited, or used as ``async with``), with the response observed."""

    def __init__(self, opening: Any, call: LLMCall) -> None:
        self.opening, self.call = opening, call
        self.response: _ObservedAsyncResponse | None = None

    async def _open(self, open_response: Callable[[], Any]) -> _ObservedAsyncResponse:
        try:
            response = await open_response()
        except BaseException as exc:
            self.call.finish(None, error=exc)
            raise
        self.response = _ObservedAsyncResponse(response, _answer(self.call, response.status))
        return self.response

    def __await__(self) -> Any:
        return self._open(lambda: self.opening).__await__()

    async def __aenter__(self) -> _ObservedAsyncResponse:
        return await self._open(self.opening.__aenter__)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.opening.__aexit__(exc_type, exc, tb)
        if self.response is not None:
            self.response._self_answer.finish(complete=False)


def stream(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``StdlibTransport.stream``: the response, observed."""
    call = _start(args[0] if args else kwargs["request"])
    if call is None:
        return wrapped(*args, **kwargs)
    try:
        response = wrapped(*args, **kwargs)
    except BaseException as exc:
        call.finish(None, error=exc)
        raise
    return _ObservedResponse(response, _answer(call, response.status))


def astream(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``StdlibAsyncTransport.stream``: the response it opens, observed."""
    call = _start(args[0] if args else kwargs["request"])
    if call is None:
        return wrapped(*args, **kwargs)
    return _ObservedStream(wrapped(*args, **kwargs), call)
