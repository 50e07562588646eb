"""What capture of the Stainless-generated clients (``openai``, ``anthropic``) shares: their resource methods wrapped
with wrapt (:class:`Patch`, which the other adapters use too; every client instance is covered), the request body as
sent read from the keyword arguments, and a call recorded when it ends: a response when it returns, a stream when it
is consumed, fails or is closed early, a raw response when it is parsed. Outside a rollout a wrapped call costs one
ContextVar lookup; a failure of capture itself is logged and never breaks the agent's call."""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Generator, Iterator
from contextvars import ContextVar
from types import ModuleType
from typing import Any

import pydantic
import wrapt

from agentlightning._wire.messages import as_plain
from agentlightning._wire.read import StreamFold, read_response
from agentlightning.capture import LLMCall, RolloutRecorder, current_recorder, note_stray_call
from agentlightning.protocol import ROLE_HEADER

logger = logging.getLogger(__name__)

# Keyword arguments of the clients that are transport options, not part of the request body.
_TRANSPORT_KEYS = frozenset({"extra_headers", "extra_query", "extra_body", "timeout"})
# Arguments the clients take as any iterable (read once when they build the request).
_ITERABLE_KEYS = frozenset({"messages", "tools", "input", "system"})

Wrapper = Callable[[Callable[..., Any], Any, tuple[Any, ...], dict[str, Any]], Any]

# Whether a wrapped resource method (``create``, ``parse``, ...) that records its call is running in this context: the
# HTTP requests the client sends meanwhile are that call, so the httpx adapter leaves them alone; the client's other
# requests (``client.post``, ``client.request``, as LiteLLM sends them) are recorded by the httpx adapter instead.
_resource_call_running: ContextVar[bool] = ContextVar("agl_resource_call_running", default=False)


def resource_call_running() -> bool:
    """Whether a wrapped resource method is recording the HTTP requests sent now (see ``_resource_call_running``)."""
    return _resource_call_running.get()


async def _as_resource_call(pending: Awaitable[Any]) -> Any:
    token = _resource_call_running.set(True)
    try:
        return await pending
    finally:
        _resource_call_running.reset(token)


def endpoint(resource: Any) -> str | None:
    """The base URL of the client behind a resource, without trailing slash."""
    client = getattr(resource, "_client", None)
    return None if client is None else str(client.base_url).rstrip("/")


class ClientCall(LLMCall):
    """A call of a client package ``sdk`` (its Stream, AsyncStream, APIResponse, AsyncAPIResponse, NotGiven, Omit):
    its result may be a stream or a raw response, recorded when consumed or read."""

    def __init__(
        self, sdk: ModuleType, api: str, recorder: RolloutRecorder, resource: Any, kwargs: dict[str, Any]
    ) -> None:
        self.sdk = sdk
        super().__init__(api, recorder, endpoint(resource), self.as_sent(kwargs))
        if (role := self.fields["role"]) is not None:  # the proxy serves the call by the role's policy
            headers = kwargs.get("extra_headers")
            kwargs["extra_headers"] = {**(headers if isinstance(headers, dict) else {}), ROLE_HEADER: role}

    def as_sent(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The request body the client sends for ``kwargs`` (a plain copy, safe from later changes by the agent): unset
        arguments left out, ``extra_body`` merged in. A one-shot iterable (e.g. a generator of messages) is
        materialised in ``kwargs`` too, so that reading it here does not starve the real call."""
        body = {}
        for key, value in kwargs.items():
            if key in _TRANSPORT_KEYS or value is None or isinstance(value, (self.sdk.NotGiven, self.sdk.Omit)):
                continue
            if key in _ITERABLE_KEYS and not isinstance(value, (str, dict, list, tuple)):
                value = kwargs[key] = list(value)
            body[key] = value
        if isinstance(kwargs.get("extra_body"), dict):
            body.update(kwargs["extra_body"])
        return as_plain(body)

    def handle(self, result: Any) -> Any:
        """Record ``result``, or return the proxy that records it when it is consumed (a stream) or read (a raw
        response whose body comes later); a parsed response is returned as is."""
        sdk = self.sdk
        try:
            if isinstance(result, pydantic.BaseModel):
                self.finish(read_response(self.api, result))
            elif isinstance(result, sdk.Stream):
                return ObservedStream(result, self)
            elif isinstance(result, sdk.AsyncStream):
                return ObservedAsyncStream(result, self)
            elif isinstance(result, sdk.AsyncAPIResponse):
                return _ObservedAsyncRaw(result, self)
            elif isinstance(result, sdk.APIResponse) or self.fields["metadata"]["stream"]:
                return _ObservedRaw(result, self)
            else:  # with_raw_response: the body is read already
                self.fields["metadata"]["raw_response"] = True
                self.finish(read_response(self.api, result.http_response.json()))
        except Exception:  # noqa: BLE001
            logger.warning(
                "%s capture failed to record a %s call; the agent continues", sdk.__name__, self.api, exc_info=True
            )
        return result


class Patch:
    """The wrapped methods of one package: ``targets`` are the methods of the client package ``sdk`` whose calls are
    recorded (module, class, method, api recorded in ``Call.metadata["api"]``, is_async); ``extra`` are (module, class,
    method, wrapper) for other methods (a client's helpers, httpx's ``send``, the framework adapters' hooks)."""

    def __init__(
        self,
        sdk: ModuleType | None = None,
        targets: tuple[tuple[str, str, str, str, bool], ...] = (),
        extra: tuple[tuple[str, str, str, Wrapper], ...] = (),
    ) -> None:
        self.sdk, self.targets, self.extra = sdk, targets, extra
        self.lock = threading.Lock()
        self.originals: list[tuple[type, str, Any]] = []

    def install(self) -> None:
        """Wrap the methods (idempotent)."""
        with self.lock:
            if self.originals:
                return
            targets = [
                (module, cls, method, self._async_wrapper(api) if is_async else self._sync_wrapper(api))
                for module, cls, method, api, is_async in self.targets
            ]
            for module_name, class_name, method, wrapper in [*targets, *self.extra]:
                try:
                    cls = getattr(importlib.import_module(module_name), class_name)
                    original = cls.__dict__[method]
                except (ImportError, AttributeError, KeyError):
                    logger.warning(
                        "capture: %s.%s.%s not found; that API is not captured", module_name, class_name, method
                    )
                    continue
                setattr(cls, method, wrapt.FunctionWrapper(original, wrapper))
                self.originals.append((cls, method, original))

    def uninstall(self) -> None:
        """Restore the original methods (idempotent)."""
        with self.lock:
            for cls, method, original in reversed(self.originals):
                setattr(cls, method, original)
            self.originals.clear()

    def is_installed(self) -> bool:
        """Whether the methods are wrapped now."""
        return bool(self.originals)

    def start(self, api: str, instance: Any, kwargs: dict[str, Any]) -> ClientCall | None:
        """The recording of a call starting now, or None outside a rollout (or when capture fails to start)."""
        recorder = current_recorder()
        if recorder is None or not self.originals:
            note_stray_call(endpoint(instance))  # for the diagnostics of a rollout that captured nothing
            return None
        try:
            assert self.sdk is not None, "start() records calls of an SDK's own methods"
            return ClientCall(self.sdk, api, recorder, instance, kwargs)
        except Exception:  # noqa: BLE001 - a capture bug must not break the agent
            logger.warning("capture failed at the start of a %s call; it is not recorded", api, exc_info=True)
            return None

    def _sync_wrapper(self, api: str) -> Wrapper:
        def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            call = self.start(api, instance, kwargs)
            if call is None:
                return wrapped(*args, **kwargs)
            token = _resource_call_running.set(True)
            try:
                return recorded(call, wrapped, args, kwargs, call.handle)
            finally:
                _resource_call_running.reset(token)

        return wrapper

    def _async_wrapper(self, api: str) -> Wrapper:
        def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            call = self.start(api, instance, kwargs)
            if call is None:
                return wrapped(*args, **kwargs)
            return arecorded(call, _as_resource_call(wrapped(*args, **kwargs)), call.handle)

        return wrapper


def recorded(
    call: LLMCall,
    wrapped: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    then: Callable[[Any], Any],
) -> Any:
    """``then(wrapped(*args, **kwargs))``; a call that raises is recorded as failed (and the error re-raised)."""
    try:
        result = wrapped(*args, **kwargs)
    except BaseException as exc:
        call.finish(None, error=exc)
        raise
    return then(result)


async def arecorded(call: LLMCall, pending: Any, then: Callable[[Any], Any]) -> Any:
    """``then(await pending)``, as :func:`recorded`."""
    try:
        result = await pending
    except BaseException as exc:
        call.finish(None, error=exc)
        raise
    return then(result)


class _StreamEnd:
    """Folds a stream's chunks as they pass and records the call when iteration ends: exhausted (complete), raised
    (with the error), closed or collected early (GeneratorExit: an incomplete stream)."""

    def __init__(self, call: LLMCall) -> None:
        self.call = call
        self.fold = StreamFold(call.api)

    def add(self, chunk: Any) -> None:
        try:
            self.fold.add(chunk)
        except Exception:  # noqa: BLE001
            logger.warning("capture could not read a stream chunk", exc_info=True)

    def __enter__(self) -> _StreamEnd:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        error = None if exc is None or isinstance(exc, GeneratorExit) else exc
        try:
            self.call.finish(self.fold.answer(complete=exc is None), error=error)
        except Exception:  # noqa: BLE001
            logger.warning("capture failed to record a streamed %s call", self.call.api, exc_info=True)


def observed(chunks: Iterator[Any], call: LLMCall) -> Generator[Any, None, None]:
    """``chunks``, passed on while the call is recorded from them (see :class:`_StreamEnd`)."""
    with _StreamEnd(call) as end:
        for chunk in chunks:
            end.add(chunk)
            yield chunk


async def _aobserved(chunks: AsyncIterator[Any], call: LLMCall) -> AsyncGenerator[Any, None]:
    with _StreamEnd(call) as end:
        async for chunk in chunks:
            end.add(chunk)
            yield chunk


class ObservedStream(wrapt.ObjectProxy):
    """A client's ``Stream`` whose iteration is recorded (see :class:`_StreamEnd`)."""

    def __init__(self, stream: Any, call: LLMCall) -> None:
        super().__init__(stream)
        self._self_chunks = observed(iter(stream), call)

    def __iter__(self) -> Iterator[Any]:
        return self._self_chunks

    def __next__(self) -> Any:
        return next(self._self_chunks)

    def close(self) -> None:
        try:
            self.__wrapped__.close()
        finally:
            self._self_chunks.close()

    def __enter__(self) -> ObservedStream:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


class ObservedAsyncStream(wrapt.ObjectProxy):
    """A client's ``AsyncStream`` whose iteration is recorded (see :class:`_StreamEnd`)."""

    def __init__(self, stream: Any, call: LLMCall) -> None:
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

    async def aclose(self) -> None:
        """``close()`` by the name the client also gives it (and LiteLLM calls)."""
        await self.close()

    async def __aenter__(self) -> ObservedAsyncStream:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()


class _ObservedRaw(wrapt.ObjectProxy):
    """A raw response whose body is read later: the call is recorded when ``parse()`` first reads it."""

    def __init__(self, raw: Any, call: ClientCall) -> None:
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

    async def parse(self, *args: Any, **kwargs: Any) -> Any:
        if self._self_parsed is None:
            self._self_call.fields["metadata"]["raw_response"] = True
            self._self_parsed = self._self_call.handle(await self.__wrapped__.parse(*args, **kwargs))
        return self._self_parsed
