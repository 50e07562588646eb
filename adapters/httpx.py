"""Capture of OpenAI-compatible requests an agent sends itself with ``httpx`` (``httpx.post(llm.base_url +
"/chat/completions", json=...)``, ``httpx.Client`` / ``AsyncClient``, streamed or not): inside a rollout, each POST
to a path ending in ``/chat/completions``, ``/completions`` or ``/responses`` becomes a ``Call``, read from the JSON
body sent and the answer (a streamed body when it is read through or closed); inside ``agl.role`` the request
carries the role for the proxy (``X-AGL-Role``). Requests of the openai and anthropic clients (``X-Stainless-*``
headers) are left to their adapters. Other HTTP clients are captured by the server's proxy.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
from agentlightning.adapters._stainless import Patch, arecorded, recorded

from agentlightning._wire.read import ENDPOINTS, StreamFold, read_response
from agentlightning.capture import LLMCall, current_recorder
from agentlightning.protocol import ROLE_HEADER

logger = logging.getLogger(__name__)

_ENDPOINT = re.compile(r"^(.*?)/(chat/completions|completions|responses)/?$")


class _Answer:
    """Reads a response body as it passes and records the call: complete when read through, else incomplete."""

    def __init__(self, call: LLMCall, response: httpx.Response) -> None:
        self.call, self.response, self.body = call, response, bytearray()
        self.fold = StreamFold(call.api) if call.fields["metadata"]["stream"] and response.is_success else None

    def add(self, data: bytes) -> bytes:
        if self.fold is None:
            self.body.extend(data)
        else:
            self.fold.feed(data)
        return data

    def finish(self, complete: bool = True) -> None:
        response = self.response
        if not response.is_success:
            text = bytes(self.body).decode(errors="replace")[:500]
            error = httpx.HTTPStatusError(
                f"HTTP {response.status_code}: {text}", request=response.request, response=response
            )
            self.call.finish(None, error=error)
        elif self.fold is not None:
            self.call.finish(self.fold.answer(complete=complete))
        else:
            self.call.finish(read_response(self.call.api, json.loads(bytes(self.body))) if complete else None)


class _Tee:
    """The body of a streamed response, passed on to the agent as it is read."""

    def __init__(self, stream: Any, answer: _Answer) -> None:
        self.stream, self.answer = stream, answer


class _Stream(_Tee, httpx.SyncByteStream):
    def __iter__(self) -> Iterator[bytes]:
        yield from map(self.answer.add, self.stream)
        self.answer.finish()

    def close(self) -> None:
        self.stream.close()
        self.answer.finish(complete=False)  # after the end of the stream: nothing left to record


class _AsyncStream(_Tee, httpx.AsyncByteStream):
    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for data in self.stream:
            yield self.answer.add(data)
        self.answer.finish()

    async def aclose(self) -> None:
        await self.stream.aclose()
        self.answer.finish(complete=False)


def _observe(call: LLMCall, response: httpx.Response, *, streamed: bool) -> httpx.Response:
    try:
        answer = _Answer(call, response)
        if streamed:  # recorded as the agent reads the body
            response.stream = (_AsyncStream if isinstance(response.stream, httpx.AsyncByteStream) else _Stream)(
                response.stream, answer
            )
        else:
            answer.add(response.content)
            answer.finish()
    except Exception:  # noqa: BLE001 - a capture bug must not break the agent
        logger.warning("httpx capture failed to record a call to %s", response.url, exc_info=True)
    return response


def _start(request: httpx.Request) -> LLMCall | None:
    recorder = current_recorder()
    if recorder is None or request.method != "POST" or "x-stainless-lang" in request.headers:
        return None
    if (match := _ENDPOINT.match(str(request.url.copy_with(query=None)))) is None:
        return None
    try:
        call = LLMCall(ENDPOINTS[match[2]], recorder, match[1], json.loads(request.content))
    except Exception:  # noqa: BLE001 - a capture bug must not break the agent
        logger.warning("httpx capture could not read a request to %s; it is not recorded", request.url, exc_info=True)
        return None
    if (role := call.fields["role"]) is not None:  # the proxy serves the call by the role's policy
        request.headers[ROLE_HEADER] = role
    return call


def _send(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    call = _start(args[0] if args else kwargs["request"])
    if call is None:
        return wrapped(*args, **kwargs)
    observe = functools.partial(_observe, call, streamed=bool(kwargs.get("stream")))
    if isinstance(instance, httpx.AsyncClient):
        return arecorded(call, wrapped(*args, **kwargs), observe)
    return recorded(call, wrapped, args, kwargs, observe)


_PATCH = Patch(extra=(("httpx", "Client", "send", _send), ("httpx", "AsyncClient", "send", _send)))
install, uninstall, is_installed = _PATCH.install, _PATCH.uninstall, _PATCH.is_installed
