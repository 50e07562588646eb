"""Capture of the ``openai`` client: every chat / completions / responses call becomes a :class:`~agentlightning.Call`.

The client classes' methods are patched with wrapt (sync and async, ``parse`` included), so every client instance is
covered. A call is recorded when it ends: a response when it returns, a stream when it is consumed, fails or is closed
early, a raw response when it is parsed. Outside a rollout a wrapped call costs one ContextVar lookup; a failure of
capture itself is logged and never breaks the agent's call.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import openai
import pydantic
import wrapt

from agentlightning._wire.messages import as_plain
from agentlightning._wire.read import StreamFold, read_response
from agentlightning.capture import LLMCall, RolloutRecorder, current_recorder, note_stray_call

logger = logging.getLogger(__name__)

# (module, class, method, api name recorded in Call.metadata["api"], is_async)
_TARGETS: tuple[tuple[str, str, str, str, bool], ...] = (
    ("openai.resources.chat.completions.completions", "Completions", "create", "chat.completions", False),
    ("openai.resources.chat.completions.completions", "Completions", "parse", "chat.completions.parse", False),
    ("openai.resources.chat.completions.completions", "AsyncCompletions", "create", "chat.completions", True),
    ("openai.resources.chat.completions.completions", "AsyncCompletions", "parse", "chat.completions.parse", True),
    ("openai.resources.responses.responses", "Responses", "create", "responses", False),
    ("openai.resources.responses.responses", "Responses", "parse", "responses.parse", False),
    ("openai.resources.responses.responses", "AsyncResponses", "create", "responses", True),
    ("openai.resources.responses.responses", "AsyncResponses", "parse", "responses.parse", True),
    ("openai.resources.completions", "Completions", "create", "completions", False),
    ("openai.resources.completions", "AsyncCompletions", "create", "completions", True),
)
# The `.stream()` helpers, whose close() closes only the HTTP response of the raw stream they iterate: (module, class,
# is_async). Their raw stream (ours) is closed too, so the call is recorded when the helper closes, not whenever the
# garbage collector breaks the helper's reference cycle.
_HELPERS: tuple[tuple[str, str, bool], ...] = (
    ("openai.lib.streaming.chat._completions", "ChatCompletionStream", False),
    ("openai.lib.streaming.chat._completions", "AsyncChatCompletionStream", True),
    ("openai.lib.streaming.responses._responses", "ResponseStream", False),
    ("openai.lib.streaming.responses._responses", "AsyncResponseStream", True),
)
# Keyword arguments of the client that are transport options, not part of the request body.
_TRANSPORT_KEYS = frozenset({"extra_headers", "extra_query", "extra_body", "timeout"})
# Arguments the client takes as any iterable (read once when it builds the request).
_ITERABLE_KEYS = frozenset({"messages", "tools", "input"})

_lock = threading.Lock()
_originals: list[tuple[type, str, Any]] = []


def install() -> None:
    """Patch the openai client classes (idempotent)."""
    with _lock:
        if _originals:
            return
        targets = [(module, cls, method, _async_wrapper(api) if is_async else _sync_wrapper(api))
                   for module, cls, method, api, is_async in _TARGETS]
        targets += [(module, cls, "close", _aclose_raw_too if is_async else _close_raw_too)
                    for module, cls, is_async in _HELPERS]
        for module_name, class_name, method, wrapper in targets:
            try:
                cls = getattr(importlib.import_module(module_name), class_name)
                original = cls.__dict__[method]
            except (ImportError, AttributeError, KeyError):
                logger.warning("openai capture: %s.%s.%s not found; that API is not captured",
                               module_name, class_name, method)
                continue
            setattr(cls, method, wrapt.FunctionWrapper(original, wrapper))
            _originals.append((cls, method, original))


def uninstall() -> None:
    """Restore the original openai methods (idempotent)."""
    with _lock:
        for cls, method, original in reversed(_originals):
            setattr(cls, method, original)
        _originals.clear()


def is_installed() -> bool:
    """Whether the openai client is patched now."""
    return bool(_originals)


def _endpoint(resource: Any) -> str | None:
    """The base URL of the client behind an openai resource, without trailing slash."""
    client = getattr(resource, "_client", None)
    return None if client is None else str(client.base_url).rstrip("/")


def _start(api: str, instance: Any, kwargs: dict[str, Any]) -> _Call | None:
    """The recording of a call starting now, or None outside a rollout (or when capture fails to start)."""
    recorder = current_recorder()
    if recorder is None or not _originals:
        note_stray_call(_endpoint(instance))  # for the diagnostics of a rollout that captured nothing
        return None
    try:
        return _Call(api, recorder, instance, kwargs)
    except Exception:  # noqa: BLE001 - a capture bug must not break the agent
        logger.warning("openai capture failed at call start; this call is not recorded", exc_info=True)
        return None


def _sync_wrapper(api: str) -> Callable[..., Any]:
    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        call = _start(api, instance, kwargs)
        if call is None:
            return wrapped(*args, **kwargs)
        try:
            result = wrapped(*args, **kwargs)
        except BaseException as exc:
            call.finish(None, error=exc)
            raise
        return call.handle(result)

    return wrapper


def _async_wrapper(api: str) -> Callable[..., Any]:
    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        call = _start(api, instance, kwargs)
        return wrapped(*args, **kwargs) if call is None else _acall(call, wrapped(*args, **kwargs))

    return wrapper


async def _acall(call: _Call, pending: Any) -> Any:
    try:
        result = await pending
    except BaseException as exc:
        call.finish(None, error=exc)
        raise
    return call.handle(result)


def _as_sent(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The request body the client sends for ``kwargs`` (a plain copy, safe from later changes by the agent): unset
    arguments left out, ``extra_body`` merged in. A one-shot iterable (e.g. a generator of messages) is materialised
    in ``kwargs`` too, so that reading it here does not starve the real call."""
    body = {}
    for key, value in kwargs.items():
        if key in _TRANSPORT_KEYS or value is None or isinstance(value, (openai.NotGiven, openai.Omit)):
            continue
        if key in _ITERABLE_KEYS and not isinstance(value, (str, dict, list, tuple)):
            value = kwargs[key] = list(value)
        body[key] = value
    if isinstance(kwargs.get("extra_body"), dict):
        body.update(kwargs["extra_body"])
    return as_plain(body)


class _Call(LLMCall):
    """An openai client call: its result may be a stream or a raw response, recorded when consumed or read."""

    def __init__(self, api: str, recorder: RolloutRecorder, resource: Any, kwargs: dict[str, Any]) -> None:
        super().__init__(api, recorder, _endpoint(resource), _as_sent(kwargs))

    def handle(self, result: Any) -> Any:
        """Record ``result``, or return the proxy that records it when it is consumed (a stream) or read (a raw
        response whose body comes later); a parsed response is returned as is."""
        try:
            if isinstance(result, pydantic.BaseModel):
                self.finish(read_response(self.api, result))
            elif isinstance(result, openai.Stream):
                return _ObservedStream(result, self)
            elif isinstance(result, openai.AsyncStream):
                return _ObservedAsyncStream(result, self)
            elif isinstance(result, openai.AsyncAPIResponse):
                return _ObservedAsyncRaw(result, self)
            elif isinstance(result, openai.APIResponse) or self.fields["metadata"]["stream"]:
                return _ObservedRaw(result, self)
            else:  # with_raw_response: the body is read already
                self.fields["metadata"]["raw_response"] = True
                self.finish(read_response(self.api, result.http_response.json()))
        except Exception:  # noqa: BLE001
            logger.warning("openai capture failed to record a %s call; the agent continues", self.api, exc_info=True)
        return result


class _StreamEnd:
    """Folds a stream's chunks as they pass and records the call when iteration ends: exhausted (complete), raised
    (with the error), closed or collected early (GeneratorExit: an incomplete stream)."""

    def __init__(self, call: _Call) -> None:
        self.call = call
        self.fold = StreamFold(call.api)

    def add(self, chunk: Any) -> None:
        try:
            self.fold.add(chunk)
        except Exception:  # noqa: BLE001
            logger.warning("openai capture could not read a stream chunk", exc_info=True)

    def __enter__(self) -> _StreamEnd:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        error = None if exc is None or isinstance(exc, GeneratorExit) else exc
        try:
            self.call.finish(self.fold.answer(complete=exc is None), error=error)
        except Exception:  # noqa: BLE001
            logger.warning("openai capture failed to record a streamed %s call", self.call.api, exc_info=True)


def _observed(chunks: Iterator[Any], call: _Call) -> Iterator[Any]:
    with _StreamEnd(call) as end:
        for chunk in chunks:
            end.add(chunk)
            yield chunk


async def _aobserved(chunks: AsyncIterator[Any], call: _Call) -> AsyncIterator[Any]:
    with _StreamEnd(call) as end:
        async for chunk in chunks:
            end.add(chunk)
            yield chunk


class _ObservedStream(wrapt.ObjectProxy):
    """An ``openai.Stream`` whose iteration is recorded (see :class:`_StreamEnd`)."""

    def __init__(self, stream: Any, call: _Call) -> None:
        super().__init__(stream)
        self._self_chunks = _observed(iter(stream), call)

    def __iter__(self) -> Iterator[Any]:
        return self._self_chunks

    def __next__(self) -> Any:
        return next(self._self_chunks)

    def close(self) -> None:
        try:
            self.__wrapped__.close()
        finally:
            self._self_chunks.close()

    def __enter__(self) -> _ObservedStream:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


class _ObservedAsyncStream(wrapt.ObjectProxy):
    """An ``openai.AsyncStream`` whose iteration is recorded (see :class:`_StreamEnd`)."""

    def __init__(self, stream: Any, call: _Call) -> None:
        super().__init__(stream)
        self._self_chunks = _aobserved(stream.__aiter__(), call)

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._self_chunks

    async def __anext__(self) -> Any:
        return await self._self_chunks.__anext__()

    async def close(self) -> None:
        try:
            await self.__wrapped__.close()
        finally:
            await self._self_chunks.aclose()

    async def __aenter__(self) -> _ObservedAsyncStream:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()


def _close_raw_too(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    try:
        return wrapped(*args, **kwargs)
    finally:
        if isinstance(raw := getattr(instance, "_raw_stream", None), _ObservedStream):
            raw.close()


async def _aclose_raw_too(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
                          ) -> Any:
    try:
        return await wrapped(*args, **kwargs)
    finally:
        if isinstance(raw := getattr(instance, "_raw_stream", None), _ObservedAsyncStream):
            await raw.close()


class _ObservedRaw(wrapt.ObjectProxy):
    """A raw response whose body is read later: the call is recorded when ``parse()`` first reads it."""

    def __init__(self, raw: Any, call: _Call) -> None:
        super().__init__(raw)
        self._self_call = call
        self._self_parsed: Any = None

    def parse(self, *args: Any, **kwargs: Any) -> Any:
        if self._self_parsed is None:
            self._self_call.fields["metadata"]["raw_response"] = True
            self._self_parsed = self._self_call.handle(self.__wrapped__.parse(*args, **kwargs))
        return self._self_parsed


class _ObservedAsyncRaw(_ObservedRaw):
    """An async raw response (``with_streaming_response``): recorded when ``await parse()`` first reads it."""

    async def parse(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        if self._self_parsed is None:
            self._self_call.fields["metadata"]["raw_response"] = True
            self._self_parsed = self._self_call.handle(await self.__wrapped__.parse(*args, **kwargs))
        return self._self_parsed
