"""AutoGen adapter: each model call is attributed to the agent whose model client makes it, tool executions are
recorded.

Every message an AutoGen agent handles (``autogen_core.BaseAgent.on_message``: each team participant, custom agents
included, and every group-chat manager: selector, Magentic-One orchestrator, ...) runs with that agent's name as the
current role, and so does ``BaseChatAgent.run`` / ``run_stream`` of an agent used alone; ``AssistantAgent._call_llm``
and ``_reflect_on_tool_use_flow`` name the agent for its direct ``on_messages`` too. ``AssistantAgent.
_execute_tool_call`` (any tool or workbench, handoffs included) becomes a ``kind="tool"`` call with status. Patched
with ``wrapt`` (see ``_stainless.Patch``), undone by ``uninstall()``.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from agentlightning.adapters._stainless import Patch
from agentlightning.adapters._tools import PendingTool, error_text, parse_arguments
from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.teams._group_chat._base_group_chat_manager import BaseGroupChatManager
from autogen_agentchat.teams._group_chat._chat_agent_container import ChatAgentContainer
from autogen_core import BaseAgent

from agentlightning.capture import current_recorder, reset_role, set_role

logger = logging.getLogger(__name__)


async def _stepped_in_role(generator: Any, role: str) -> AsyncIterator[Any]:
    """Iterate an async generator with ``role`` current during each of its steps (and only then)."""
    try:
        while True:
            token = set_role(role)
            try:
                item = await generator.__anext__()
            except StopAsyncIteration:
                return
            finally:
                reset_role(token)
            yield item
    finally:
        await generator.aclose()


def _argument(function: Callable[..., Any], name: str) -> Callable[[tuple[Any, ...], dict[str, Any]], Any]:
    """A getter for argument ``name`` of ``function`` from a call's ``args`` / ``kwargs``."""
    signature = inspect.signature(function)
    parameters = [p for p in signature.parameters if p != "cls"]
    position = parameters.index(name)

    def get(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return kwargs[name] if name in kwargs else args[position]

    return get


def _agent_llm_wrapper(function: Callable[..., Any]) -> Callable[..., Any]:
    agent_name = _argument(function, "agent_name")

    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        generator = wrapped(*args, **kwargs)
        try:
            name = agent_name(args, kwargs)
        except (IndexError, KeyError):  # capture must never break the agent
            logger.exception("autogen adapter: no agent_name in %s's arguments", wrapped.__qualname__)
            return generator
        return _stepped_in_role(generator, name) if isinstance(name, str) and name else generator

    return wrapper


def _tool_wrapper(function: Callable[..., Any]) -> Callable[..., Any]:
    tool_call_of = _argument(function, "tool_call")
    agent_name = _argument(function, "agent_name")

    async def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        recorder = current_recorder()
        if recorder is None:
            return await wrapped(*args, **kwargs)
        try:
            tool_call = tool_call_of(args, kwargs)
            pending = PendingTool(
                recorder,
                tool_call.name,
                parse_arguments(tool_call.arguments),
                agent_name(args, kwargs),
                "autogen",
                tool_call_id=tool_call.id,
            )
        except Exception:  # capture must never break the agent
            logger.exception("autogen adapter: could not start recording a tool call")
            return await wrapped(*args, **kwargs)
        try:
            call, result = await wrapped(*args, **kwargs)
        except BaseException as exc:
            pending.finish(None, error=error_text(exc))
            raise
        pending.finish(result.content, error=f"ToolError: {result.content}" if result.is_error else None)
        return call, result

    return wrapper


def _agent_name(agent: Any) -> str:
    """The name of an AutoGen core agent: the chat agent a team participant wraps, a group-chat manager's name, or
    the agent's registered type."""
    if isinstance(agent, ChatAgentContainer):
        return agent._agent.name  # noqa: SLF001 - the participant's name is not exposed otherwise
    if isinstance(agent, BaseGroupChatManager):
        return agent._name  # noqa: SLF001
    return agent.id.type


async def _in_agent_role(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    token = set_role(_agent_name(instance) if isinstance(instance, BaseAgent) else instance.name)
    try:
        return await wrapped(*args, **kwargs)
    finally:
        reset_role(token)


def _stream_in_agent_role(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    return _stepped_in_role(wrapped(*args, **kwargs), instance.name)


_AGENTS = "autogen_agentchat.agents"
_PATCH = Patch(
    extra=(
        *(
            (_AGENTS, "AssistantAgent", name, _agent_llm_wrapper(getattr(AssistantAgent, name)))
            for name in ("_call_llm", "_reflect_on_tool_use_flow")
        ),
        (_AGENTS, "AssistantAgent", "_execute_tool_call", _tool_wrapper(AssistantAgent._execute_tool_call)),
        ("autogen_core", "BaseAgent", "on_message", _in_agent_role),
        (_AGENTS, "BaseChatAgent", "run", _in_agent_role),
        (_AGENTS, "BaseChatAgent", "run_stream", _stream_in_agent_role),
    )
)
install, uninstall, is_installed = _PATCH.install, _PATCH.uninstall, _PATCH.is_installed
