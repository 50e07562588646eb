"""Capture of the ``anthropic`` client: every Messages API call (``client.messages.create`` / ``parse``, streamed or
not, and the ``client.messages.stream(...)`` helper; sync and async) becomes a :class:`~agentlightning.Call`, read by
``_wire.read`` as ``api="messages"`` (see ``_stainless`` for how calls are wrapped and recorded)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import anthropic
from agentlightning.adapters._stainless import ObservedAsyncStream, ObservedStream, Patch

from agentlightning.capture import LLMCall, current_recorder

logger = logging.getLogger(__name__)

_MESSAGES = "anthropic.resources.messages.messages"
_TARGETS: tuple[tuple[str, str, str, str, bool], ...] = (
    (_MESSAGES, "Messages", "create", "messages", False),
    (_MESSAGES, "Messages", "parse", "messages.parse", False),
    (_MESSAGES, "AsyncMessages", "create", "messages", True),
    (_MESSAGES, "AsyncMessages", "parse", "messages.parse", True),
)


def _helper_stream(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``MessageStream(raw_stream, ...)``: ``.stream()`` sends its request without ``create``, so the call is recorded
    from the raw stream it iterates (the request as its HTTP request sent it)."""
    recorder = current_recorder()
    if recorder is not None and args and not isinstance(args[0], (ObservedStream, ObservedAsyncStream)):
        try:
            request = args[0].response.request
            call = LLMCall(
                "messages",
                recorder,
                str(request.url).removesuffix("/v1/messages").rstrip("/"),
                json.loads(request.content),
            )
            observed = ObservedAsyncStream if isinstance(args[0], anthropic.AsyncStream) else ObservedStream
            args = (observed(args[0], call), *args[1:])
        except Exception:  # noqa: BLE001 - a capture bug must not break the agent
            logger.warning("anthropic capture could not read a .stream() request; it is not recorded", exc_info=True)
    return wrapped(*args, **kwargs)


_STREAMS = "anthropic.lib.streaming._messages"
_PATCH = Patch(
    anthropic,
    _TARGETS,
    (
        (_STREAMS, "MessageStream", "__init__", _helper_stream),
        (_STREAMS, "AsyncMessageStream", "__init__", _helper_stream),
    ),
)
install, uninstall, is_installed = _PATCH.install, _PATCH.uninstall, _PATCH.is_installed
