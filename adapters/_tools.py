"""Shared by the framework adapters: a tool execution recorded as a ``Call``, linked to the LLM call that asked for
it."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from agentlightning.capture import RolloutRecorder
from agentlightning.types import Call

logger = logging.getLogger(__name__)


@dataclass
class PendingTool:
    """A tool execution that has started: its sequence number is reserved now (calls are ordered by start)."""

    recorder: RolloutRecorder
    name: str
    arguments: Any
    role: str | None
    adapter: str
    tool_call_id: str | None = None
    # Only the LLM calls of the tool's own role can have asked for it: for frameworks whose agents each see only their
    # own model output (a smolagents CodeAgent calls its tools from code, with no tool-call id to match).
    same_role: bool = False
    start_time: float = field(default_factory=time.time)
    sequence: int = field(init=False)

    def __post_init__(self) -> None:
        self.sequence = self.recorder.next_sequence()

    def finish(self, output: Any = None, error: str | None = None, extra: dict[str, Any] | None = None) -> Call | None:
        """Record the tool call as finished (failed with ``error``, type and message), with the role of the LLM call
        that requested it unless it has its own, and the adapter's ``extra`` metadata. Never raises: a capture failure
        is logged and the agent goes on."""
        try:
            parent = requesting_llm_call(
                self.recorder, self.tool_call_id, self.name, self.arguments, self.role, same_role=self.same_role
            )
            metadata = {"adapter": self.adapter} | ({"tool_call_id": self.tool_call_id} if self.tool_call_id else {})
            metadata |= extra or {}
            role = self.role if self.role is not None or parent is None else parent.role
            call = Call(
                kind="tool",
                sequence=self.sequence,
                role=role,
                name=self.name,
                input=jsonable(self.arguments),
                output=jsonable(output),
                status="ok" if error is None else "error",
                error=error,
                parent_call_id=parent.call_id if parent is not None else None,
                start_time=self.start_time,
                end_time=time.time(),
                metadata=metadata,
            )
            self.recorder.add_call(call)
        except Exception:  # capture must never break the agent
            logger.exception("%s adapter: could not record tool call %r", self.adapter, self.name)
            return None
        return call


def jsonable(value: Any) -> Any:
    """``value`` when it is JSON-serialisable (so stored rollouts round-trip), else its ``str``."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return str(value)
    return value


def error_text(error: BaseException) -> str:
    """``'ValueError: message'``, the form every adapter stores in ``Call.error``."""
    return f"{type(error).__name__}: {error}"


def requesting_llm_call(
    recorder: RolloutRecorder,
    tool_call_id: str | None,
    name: str,
    arguments: Any,
    role: str | None,
    *,
    same_role: bool = False,
) -> Call | None:
    """The LLM call whose output requested a tool call. Matches, newest first: the tool-call id; else the tool name and
    arguments (preferring a call of ``role``); else the tool name; else the latest LLM call of the rollout. With
    ``same_role``, only the LLM calls whose role is exactly ``role`` (``None`` included) are candidates, when there are
    any."""
    snapshot = list(recorder.calls)  # copying a list is atomic; other threads may append meanwhile
    llm_calls = [call for call in reversed(snapshot) if call.kind == "llm"]
    if same_role:
        llm_calls = [call for call in llm_calls if call.role == role] or llm_calls
    requests = [(call, request) for call in llm_calls for request in _requested_tools(call)]
    if tool_call_id is not None:
        for call, request in requests:
            if request.get("id") == tool_call_id:
                return call
    wanted = parse_arguments(arguments)
    named = [(call, request) for call, request in requests if request["name"] == name]
    for call, request in named:
        if wanted is not None and parse_arguments(request["arguments"]) == wanted and role in (None, call.role):
            return call
    return named[0][0] if named else llm_calls[0] if llm_calls else None


def _requested_tools(call: Call) -> list[dict[str, Any]]:
    """The tool calls an LLM call's output asked for, as ``{'id', 'name', 'arguments'}`` dicts."""
    output = call.output
    if not isinstance(output, dict):
        return []
    requests = []
    for item in output.get("tool_calls") or []:
        if isinstance(item, dict):
            function = item["function"] if isinstance(item.get("function"), dict) else item
            requests.append(
                {
                    "id": item.get("id") or item.get("call_id"),
                    "name": function.get("name"),
                    "arguments": function.get("arguments"),
                }
            )
    return requests


def parse_arguments(arguments: Any) -> Any:
    """Tool arguments as data: JSON text is parsed (so dicts compare by value); anything else is returned as is."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments
