"""CrewAI adapter: the calling agent's ``role`` is the role of each model call, and each tool call is recorded with
its status.

CrewAI's interception hooks (``crewai.hooks``: ``before_llm_call`` / ``before_tool_call`` / ``after_tool_call`` and
the execution boundaries) run synchronously where the agent runs, unlike its event bus, whose handlers run later in a
thread pool. The adapter registers global hooks:

- ``PRE_MODEL_CALL`` makes the calling agent's ``role`` current, so the model call that follows (through CrewAI's
  native OpenAI provider, or LiteLLM, both of which the openai-client capture records) and the tools it asks for
  carry it; a coworker an agent delegates to sets its own role on its own calls. CrewAI runs no hook after a model
  call that asked for tools, so the role stays until the next model call; ``EXECUTION_START`` / ``EXECUTION_END`` put
  the role the crew started with back when the crew ends, finished or failed.
- ``PRE_TOOL_CALL`` / ``POST_TOOL_CALL`` record each tool call as a ``kind="tool"`` call linked to the LLM call that
  asked for it (by tool name and arguments; CrewAI's hooks do not carry the tool-call id). CrewAI catches a tool's
  exception and gives the agent ``"Error executing tool: <message>"`` instead; the adapter sees it as the task's tool
  error count going up and records ``status="error"`` with that text. Outside a task (``Agent.kickoff``) CrewAI
  counts no tool errors, so a failed tool is recorded as ``ok`` with the same text as its output.
"""

from __future__ import annotations

import logging
import threading
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from agentlightning.adapters._tools import PendingTool
from crewai.hooks import (
    InterceptionPoint,
    LLMCallHookContext,
    ToolCallHookContext,
    register_hook,
    unregister_hook,
)
from crewai.hooks.contexts import ExecutionEndContext, ExecutionStartContext

from agentlightning.capture import current_recorder, current_role, set_role

logger = logging.getLogger(__name__)

# The role current when each running crew started (innermost last), put back when it ends.
_crew_roles: ContextVar[tuple[str | None, ...]] = ContextVar("agl_crewai_roles", default=())


@dataclass
class _OpenTool:
    arguments: dict[str, Any]  # kept so that its id is not reused while the call is open
    pending: PendingTool
    task: Any
    errors_at_start: int


_open_tools: dict[int, _OpenTool] = {}  # id of the tool_input dict the before and after hooks share -> its call
_open_lock = threading.Lock()


def _agent_role(context: Any) -> str | None:
    role = getattr(getattr(context, "agent", None), "role", None)
    return role if isinstance(role, str) and role else None


def _before_model_call(context: LLMCallHookContext) -> None:
    if current_recorder() is not None and (role := _agent_role(context)) is not None:
        set_role(role)
    return None  # the call goes ahead


def _execution_start(context: ExecutionStartContext) -> None:
    if current_recorder() is not None:
        _crew_roles.set((*_crew_roles.get(), current_role()))


def _execution_end(context: ExecutionEndContext) -> None:
    roles = _crew_roles.get()
    if roles:
        _crew_roles.set(roles[:-1])
        set_role(roles[-1])


def _tool_errors(task: Any) -> int:
    errors = getattr(task, "tools_errors", 0)
    return errors if isinstance(errors, int) else 0


def _before_tool_call(context: ToolCallHookContext) -> None:
    recorder = current_recorder()
    if recorder is None or not isinstance(context.tool_input, dict):
        return None
    try:
        pending = PendingTool(recorder, context.tool_name, dict(context.tool_input), _agent_role(context), "crewai")
    except Exception:  # capture must never break the agent
        logger.exception("crewai adapter: could not start recording tool %r", context.tool_name)
        return None
    with _open_lock:
        _open_tools[id(context.tool_input)] = _OpenTool(
            context.tool_input, pending, context.task, _tool_errors(context.task)
        )
    return None  # the tool runs


def _after_tool_call(context: ToolCallHookContext) -> None:
    with _open_lock:
        opened = _open_tools.pop(id(context.tool_input), None)
    if opened is None:
        return None
    result = context.tool_result
    if _tool_errors(opened.task) > opened.errors_at_start:
        opened.pending.finish(None, error=str(result))
    else:
        opened.pending.finish(result)
    return None  # the result is left as it is


_HOOKS = (
    (InterceptionPoint.PRE_MODEL_CALL, _before_model_call),
    (InterceptionPoint.EXECUTION_START, _execution_start),
    (InterceptionPoint.EXECUTION_END, _execution_end),
    (InterceptionPoint.PRE_TOOL_CALL, _before_tool_call),
    (InterceptionPoint.POST_TOOL_CALL, _after_tool_call),
)
_state = {"installed": False}
_lock = threading.Lock()


def install() -> None:
    """Register the hooks (idempotent). A crew's agents read CrewAI's global hooks when the crew starts."""
    with _lock:
        if _state["installed"]:
            return
        for point, hook in _HOOKS:
            register_hook(point, hook)
        _state["installed"] = True


def uninstall() -> None:
    """Unregister the hooks. Idempotent."""
    with _lock:
        for point, hook in _HOOKS:
            unregister_hook(point, hook)
        _state["installed"] = False
        with _open_lock:
            _open_tools.clear()


def is_installed() -> bool:
    """Whether the hooks are registered now."""
    return _state["installed"]
