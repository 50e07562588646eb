"""smolagents adapter: the running agent's ``name`` is the role of its model calls, and every tool call (managed
agents included) is recorded with its status and the model call that asked for it.

smolagents has no hook that runs *around* a model call or a tool (its ``step_callbacks`` run after a step, when the
step's model call has been sent with whatever role was current). Its OpenTelemetry instrumentation (OpenInference's
``SmolagentsInstrumentor``, what its docs use for telemetry) wraps the same public methods this adapter wraps:

- ``MultiStepAgent.run``: while an agent with a ``name`` runs (``stream=True`` included: each step the caller pulls),
  its name is the current role. A managed agent is an agent with a name, so its model calls carry its own name.
- ``ToolCallingAgent.execute_tool_call``: each tool call the model asked for, including one naming an unknown tool or
  with arguments that fail validation, becomes a ``kind="tool"`` call; a tool that raises is recorded with
  ``status="error"`` (smolagents then shows the error to the model, which may try again).
- ``Tool.__call__`` and ``MultiStepAgent.__call__`` (a managed agent called as a tool): the calls a ``CodeAgent``'s
  code makes, recorded the same way (``metadata["managed_agent"]`` marks calls of managed agents).

A tool call's parent is the latest model call of the agent that called it: agents see only their own messages, so the
match is made among the calls of the calling agent's role.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Iterator
from contextvars import ContextVar
from typing import Any

from agentlightning.adapters._stainless import Patch
from agentlightning.adapters._tools import PendingTool, error_text

from agentlightning.capture import current_recorder, current_role, reset_role, set_role

logger = logging.getLogger(__name__)

# Whether ToolCallingAgent.execute_tool_call is recording the tool running now (its Tool.__call__ is that call). An
# agent run clears it: the tools of a managed agent are that agent's own calls.
_recording_tool: ContextVar[bool] = ContextVar("agl_smolagents_recording_tool", default=False)


def _start(name: str, arguments: Any) -> PendingTool | None:
    recorder = current_recorder()
    if recorder is None:
        return None
    try:
        return PendingTool(recorder, name, arguments, current_role(), "smolagents", same_role=True)
    except Exception:  # capture must never break the agent
        logger.exception("smolagents adapter: could not start recording tool %r", name)
        return None


def _recorded(name: str, arguments: Any, call: Callable[[], Any], managed_agent: bool = False) -> Any:
    """Run ``call`` (a tool or managed agent named ``name``) recording it as a tool call."""
    pending = _start(name, arguments)
    if pending is None:
        return call()
    token = _recording_tool.set(True)
    try:
        result = call()
    except BaseException as exc:
        # smolagents raises its own AgentToolExecutionError from what the tool raised: record the tool's error.
        cause = exc.__cause__ if isinstance(exc.__cause__, Exception) else exc
        pending.finish(None, error=error_text(cause), extra={"managed_agent": managed_agent})
        raise
    finally:
        _recording_tool.reset(token)
    pending.finish(result, extra={"managed_agent": managed_agent})
    return result


def _tool_arguments(tool: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | list[Any]:
    """The arguments of a ``Tool.__call__`` by input name (positional ones mapped onto the tool's ``inputs``)."""
    kwargs = {key: value for key, value in kwargs.items() if key != "sanitize_inputs_outputs"}
    if len(args) == 1 and not kwargs and isinstance(args[0], dict):
        return dict(args[0])
    names = list(getattr(tool, "inputs", None) or ())
    if len(args) > len(names):
        return [*args, kwargs] if kwargs else list(args)
    return dict(zip(names, args, strict=False)) | kwargs


def _execute_tool_call(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    if current_recorder() is None:
        return wrapped(*args, **kwargs)
    tool_name = args[0] if args else kwargs.get("tool_name")
    arguments = args[1] if len(args) > 1 else kwargs.get("arguments")
    managed = tool_name in (getattr(instance, "managed_agents", None) or {})
    return _recorded(str(tool_name), arguments, lambda: wrapped(*args, **kwargs), managed)


def _tool_call(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if current_recorder() is None or _recording_tool.get():
        return wrapped(*args, **kwargs)
    arguments = _tool_arguments(instance, args, kwargs)
    return _recorded(str(instance.name), arguments, lambda: wrapped(*args, **kwargs))


def _managed_agent_call(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    if current_recorder() is None or _recording_tool.get():
        return wrapped(*args, **kwargs)
    arguments = {"task": args[0]} if args else {}
    arguments |= kwargs
    return _recorded(str(instance.name), arguments, lambda: wrapped(*args, **kwargs), managed_agent=True)


def _as_agent(name: str | None, step: Callable[[], Any]) -> Any:
    """``step()`` run as the agent ``name``: its name the current role (an unnamed agent keeps the role around it),
    and the tools it calls its own calls."""
    role_token = set_role(name) if name else None
    tool_token = _recording_tool.set(False)
    try:
        return step()
    finally:
        _recording_tool.reset(tool_token)
        if role_token is not None:
            reset_role(role_token)


def _stream_as(name: str | None, steps: Iterator[Any]) -> Generator[Any]:
    """``steps`` (a streamed run) with each step computed as the agent ``name``."""
    while True:
        try:
            step = _as_agent(name, lambda: next(steps))
        except StopIteration:
            return
        yield step


def _run(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if current_recorder() is None:
        return wrapped(*args, **kwargs)
    name = getattr(instance, "name", None)
    result = _as_agent(name, lambda: wrapped(*args, **kwargs))
    if isinstance(result, Generator):  # run(stream=True): the steps run as the caller pulls them
        return _stream_as(name, result)
    return result


_PATCH = Patch(
    extra=(
        ("smolagents.agents", "MultiStepAgent", "run", _run),
        ("smolagents.agents", "MultiStepAgent", "__call__", _managed_agent_call),
        ("smolagents.agents", "ToolCallingAgent", "execute_tool_call", _execute_tool_call),
        ("smolagents.tools", "Tool", "__call__", _tool_call),
        ("smolagents.tools", "PipelineTool", "__call__", _tool_call),
    )
)
install, uninstall, is_installed = _PATCH.install, _PATCH.uninstall, _PATCH.is_installed
