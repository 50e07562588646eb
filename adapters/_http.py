"""Capture of OpenAI-compatible requests sent with an httpx-shaped HTTP library (``httpx``, or ``httpx2`` under
openai 3), shared by the ``httpx`` and ``httpx2`` adapters. Inside a rollout, each POST to a path ending in
``/chat/completions``, ``/completions`` or ``/responses`` becomes a ``Call``, read from the JSON body sent and the
answer (a streamed body when it is read through or closed); inside ``agl.role`` the request carries the role for the
proxy (``X-AGL-Role``). The requests the openai and anthropic resource methods (``create``, ``parse``, ...) send are
left to those adapters, which record them already; the clients' other requests (``client.post("/chat/completions",
...)``, ``client.request(...)``, as LiteLLM sends them) are recorded here, so each HTTP call is recorded once.
:func:`start_call` and :class:`Answer` also record the requests of DSPy's own HTTP transport (``_lm15``).
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import AsyncIterator, Callable, Iterator
from types import ModuleType
from typing import Any

from agentlightning.adapters._stainless import Patch, arecorded, recorded, resource_call_running

from agentlightning._wire.read import ENDPOINTS, StreamFold, read_response
from agentlightning.capture import LLMCall, current_recorder
from agentlightning.protocol import ROLE_HEADER

logger = logging.getLogger(__name__)

_ENDPOINT = re.compile(r"^(.*?)/(chat/completions|completions|responses)/?$")


class Answer:
    """Reads a response body as it passes and records the call: complete when read through, else incomplete; a
    response that is not a success is recorded as the error ``failure(body_text)`` makes."""

    def __init__(self, call: LLMCall, success: bool, failure: Callable[[str], BaseException]) -> None:
        self.call, self.success, self.failure, self.body = call, success, failure, bytearray()
        self.fold = StreamFold(call.api) if call.fields["metadata"]["stream"] and success else None

    def add(self, data: bytes) -> bytes:
        if self.fold is None:
            self.body.extend(data)
        else:
            self.fold.feed(data)
        return data

    def finish(self, complete: bool = True) -> None:
        if not self.success:
            self.call.finish(None, error=self.failure(bytes(self.body).decode(errors="replace")[:500]))
        elif self.fold is not None:
            self.call.finish(self.fold.answer(complete=complete))
        else:
            self.call.finish(read_response(self.call.api, json.loads(bytes(self.body))) if complete else None)


class _Tee:
    """The body of a streamed response, passed on to the agent as it is read."""

    def __init__(self, stream: Any, answer: Answer) -> None:
        self.stream, self.answer = stream, answer


class _SyncTee(_Tee):
    def __iter__(self) -> Iterator[bytes]:
        yield from map(self.answer.add, self.stream)
        self.answer.finish()

    def close(self) -> None:
        self.stream.close()
        self.answer.finish(complete=False)  # after the end of the stream: nothing left to record


class _AsyncTee(_Tee):
    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for data in self.stream:
            yield self.answer.add(data)
        self.answer.finish()

    async def aclose(self) -> None:
        await self.stream.aclose()
        self.answer.finish(complete=False)


class _Capture:
    """The capture of one HTTP library ``http``: its ``Client.send`` / ``AsyncClient.send`` wrapped, its byte streams
    teed."""

    def __init__(self, http: ModuleType) -> None:
        self.http = http
        self.stream = type("_Stream", (_SyncTee, http.SyncByteStream), {})
        self.astream = type("_AsyncStream", (_AsyncTee, http.AsyncByteStream), {})
        name = http.__name__
        self.patch = Patch(extra=((name, "Client", "send", self.send), (name, "AsyncClient", "send", self.send)))

    def observe(self, call: LLMCall, response: Any, *, streamed: bool) -> Any:
        try:
            answer = Answer(call, response.is_success, functools.partial(self.failure, response))
            if streamed:  # recorded as the agent reads the body
                tee = self.astream if isinstance(response.stream, self.http.AsyncByteStream) else self.stream
                response.stream = tee(response.stream, answer)
            else:
                answer.add(response.content)
                answer.finish()
        except Exception:  # noqa: BLE001 - a capture bug must not break the agent
            logger.warning("%s capture failed to record a call to %s", self.http.__name__, response.url, exc_info=True)
        return response

    def start(self, request: Any) -> LLMCall | None:
        """The recording of ``request`` (see :func:`start_call`); None for a body streamed from an iterator, which
        only the transport may read (no LLM client sends one)."""
        try:
            content = request.content
        except self.http.RequestNotRead:
            return None
        call = start_call(request.method, str(request.url.copy_with(query=None)), content)
        if call is not None and (role := call.fields["role"]) is not None:
            request.headers[ROLE_HEADER] = role
        return call

    def failure(self, response: Any, text: str) -> BaseException:
        message = f"HTTP {response.status_code}: {text}"
        return self.http.HTTPStatusError(message, request=response.request, response=response)

    def send(self, wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        call = self.start(args[0] if args else kwargs["request"])
        if call is None:
            return wrapped(*args, **kwargs)
        observe = functools.partial(self.observe, call, streamed=bool(kwargs.get("stream")))
        if isinstance(instance, self.http.AsyncClient):
            return arecorded(call, wrapped(*args, **kwargs), observe)
        return recorded(call, wrapped, args, kwargs, observe)


def start_call(method: str, url: str, content: bytes) -> LLMCall | None:
    """The recording of an HTTP request starting now (``url`` without its query), or None: outside a rollout, when it
    is not a POST to an OpenAI-compatible endpoint, or when a client's resource method records it already. The caller
    sends the call's role, if any, in the ``X-AGL-Role`` header: the proxy serves the call by the role's policy."""
    recorder = current_recorder()
    if recorder is None or method != "POST" or resource_call_running():
        return None
    if (match := _ENDPOINT.match(url)) is None:
        return None
    try:
        return LLMCall(ENDPOINTS[match[2]], recorder, match[1], json.loads(content))
    except Exception:  # noqa: BLE001 - a capture bug must not break the agent
        logger.warning("HTTP capture could not read a request to %s; it is not recorded", url, exc_info=True)
        return None


def capture(http: ModuleType) -> Patch:
    """The patch that captures the OpenAI-compatible requests sent with ``http`` (``httpx`` or ``httpx2``)."""
    return _Capture(http).patch
