"""Google ADK adapter: the agent whose model call it is names the role, and each tool call (``AgentTool`` and
``transfer_to_agent`` included) is recorded with its status and the model call that asked for it.

ADK's hook for observability is the *plugin* (``google.adk.plugins.BasePlugin``): callbacks around every agent, model
call and tool of a runner, for all its agents. The adapter wraps ``Runner.run_async`` and ``Runner.run_live``
(``Runner.run`` and ``run_debug`` go through ``run_async``) to put one :class:`Capture` plugin first in the runner's
plugins when a run starts inside a rollout, so that no other plugin's answer can skip it; the user's plugins and
agent callbacks run as before, and a runner built before the adapter was installed is covered too.

- ``before_model_callback`` makes the calling agent's name the current role until the model answers
  (``after_model_callback`` / ``on_model_error_callback``): the LLM call ADK makes (through LiteLLM, or any client the
  capture sees) is recorded with that role, and the proxy serves it by the role's policy.
- ``before_tool_callback`` starts a ``kind="tool"`` call (ADK's function-call id links it to the model call that asked
  for it) and makes the agent's name the role of what the tool does; ``after_tool_callback`` finishes it, or
  ``on_tool_error_callback`` records it failed (``status="error"``), whether or not a later plugin such as
  ``ReflectAndRetryToolPlugin`` then answers the model in the tool's place. An ``AgentTool`` call is marked
  ``metadata["agent_tool"]``; the agent it runs names its own model calls.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any

from agentlightning.adapters._stainless import Patch
from agentlightning.adapters._tools import PendingTool, error_text
from google.adk.plugins import BasePlugin
from google.adk.tools.agent_tool import AgentTool

from agentlightning.capture import current_recorder, reset_role, set_role

logger = logging.getLogger(__name__)

PLUGIN_NAME = "agentlightning_capture"

# The role token of the model call running in this task (ADK runs a model call's callbacks in the task that calls it).
_model_role: ContextVar[Token[str | None] | None] = ContextVar("agl_adk_model_role", default=None)


@dataclass
class _RunningTool:
    pending: PendingTool
    role_token: Token[str | None]


class Capture(BasePlugin):
    """The plugin the adapter puts first in every runner's plugins (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__(name=PLUGIN_NAME)
        self._tools: dict[str, _RunningTool] = {}  # function-call id -> the tool call running

    async def before_model_callback(self, *, callback_context: Any, llm_request: Any) -> None:
        if current_recorder() is not None:
            self._end_model_call()  # one still open: a streamed answer that never sent its final response
            _model_role.set(set_role(callback_context.agent_name))
        return None

    async def after_model_callback(self, *, callback_context: Any, llm_response: Any) -> None:
        if not getattr(llm_response, "partial", False):  # a streamed answer ends with its final, non-partial response
            self._end_model_call()
        return None

    async def on_model_error_callback(self, *, callback_context: Any, llm_request: Any, error: Exception) -> None:
        self._end_model_call()
        return None

    def _end_model_call(self) -> None:
        if (token := _model_role.get()) is not None:
            reset_role(token)
            _model_role.set(None)

    async def before_tool_callback(self, *, tool: Any, tool_args: dict[str, Any], tool_context: Any) -> None:
        recorder = current_recorder()
        call_id = tool_context.function_call_id
        if recorder is None or call_id is None:
            return None
        try:
            agent = tool_context.agent_name
            pending = PendingTool(recorder, tool.name, dict(tool_args), agent, "google_adk", tool_call_id=call_id)
            self._tools[call_id] = _RunningTool(pending, set_role(agent))
        except Exception:  # capture must never break the agent
            logger.exception("google_adk adapter: could not start recording tool %r", getattr(tool, "name", tool))
        return None

    async def after_tool_callback(
        self, *, tool: Any, tool_args: dict[str, Any], tool_context: Any, result: Any
    ) -> None:
        self._finish(tool, tool_context, result, None)
        return None

    async def on_tool_error_callback(
        self, *, tool: Any, tool_args: dict[str, Any], tool_context: Any, error: BaseException
    ) -> None:
        self._finish(tool, tool_context, None, error_text(error))
        return None

    def _finish(self, tool: Any, tool_context: Any, result: Any, error: str | None) -> None:
        running = self._tools.pop(tool_context.function_call_id, None)
        if running is None:  # finished already: a failed tool that a later plugin answered for
            return
        reset_role(running.role_token)
        running.pending.finish(result, error=error, extra={"agent_tool": isinstance(tool, AgentTool)})


def _first_capture(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Before a run inside a rollout: the runner's plugins start with a :class:`Capture` (the runner an ``AgentTool``
    starts shares its caller's plugins, this one included)."""
    if current_recorder() is not None:
        plugins = instance.plugin_manager.plugins
        if not any(isinstance(plugin, Capture) for plugin in plugins):
            # First, not register_plugin's last place: a plugin that answers a callback skips the plugins after it.
            plugins.insert(0, Capture())
    return wrapped(*args, **kwargs)


_PATCH = Patch(
    extra=(
        ("google.adk.runners", "Runner", "run_async", _first_capture),
        ("google.adk.runners", "Runner", "run_live", _first_capture),
    )
)
install, uninstall, is_installed = _PATCH.install, _PATCH.uninstall, _PATCH.is_installed
