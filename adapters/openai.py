"""Capture of the ``openai`` client: every chat / completions / responses call, sync or async, ``parse`` included,
becomes a :class:`~agentlightning.Call` (see ``_stainless`` for how calls are wrapped and recorded)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import openai
from agentlightning.adapters._stainless import ObservedAsyncStream, ObservedStream, Patch

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


def _close_raw_too(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    try:
        return wrapped(*args, **kwargs)
    finally:
        if isinstance(raw := getattr(instance, "_raw_stream", None), ObservedStream):
            raw.close()


async def _aclose_raw_too(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    try:
        return await wrapped(*args, **kwargs)
    finally:
        if isinstance(raw := getattr(instance, "_raw_stream", None), ObservedAsyncStream):
            await raw.close()


_PATCH = Patch(
    openai,
    _TARGETS,
    tuple(
        (module, cls, "close", _aclose_raw_too if is_async else _close_raw_too) for module, cls, is_async in _HELPERS
    ),
)
install, uninstall, is_installed = _PATCH.install, _PATCH.uninstall, _PATCH.is_installed
