"""LangChain / LangGraph adapter: who is speaking (the innermost agent or named step) and what the tools did.

A callback handler registered globally (``register_configure_hook``) keeps the run tree and, while a model run
executes, makes the role of the run that names it current, for the openai-client capture to record. The role, first
found from the model run up: an explicit ``agl_role`` (metadata ``{"agl_role": "writer"}`` or a tag
``"agl_role:writer"``, wherever it was set above); else the nearest name the user gave (``run_name``, a
``RunnableLambda``/``@chain`` function, a LangGraph node or a named graph: ``create_react_agent(..., name=...)``,
``create_agent(..., name=...)``, a subgraph); else the model's own name (``ChatOpenAI(name="judge")``); else the name
of a LangGraph agent's internal node (``agent``, ``model``, ``tools``, middleware hooks). LangChain's own class names
never name a role. An ``agl.role`` entered inside the run that names the role wins over it. Tool runs become
``kind="tool"`` calls with status and error.
"""

from __future__ import annotations

import logging
import sys
import threading
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from agentlightning.adapters._tools import PendingTool, error_text
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import ToolMessage
from langchain_core.runnables import Runnable
from langchain_core.tracers import context as tracer_context

from agentlightning.capture import RolloutRecorder, current_recorder, current_role, reset_role, set_role

logger = logging.getLogger(__name__)

ROLE_KEY = "agl_role"
ROLE_TAG_PREFIX = "agl_role:"
# Nodes LangGraph's agent factories (create_react_agent, create_agent) build: they name a role only when nothing
# around them does. Middleware hooks of create_agent are nodes named "<Middleware>.<hook>".
_AGENT_NODES = frozenset(
    {"agent", "model", "tools", "pre_model_hook", "post_model_hook", "generate_structured_response"}
)


@dataclass
class _Run:
    """What the handler remembers of a running runnable."""

    parent_id: UUID | None
    explicit: str | None  # agl_role set at this run (metadata or tag, not inherited from the parent)
    name: str | None  # a name the user gave this run
    internal: str | None  # the name of a LangGraph agent's internal node
    metadata_role: str | None
    tag_role: str | None
    recorder: RolloutRecorder | None
    role_at_start: str | None
    role_token: Token[str | None] | None = None
    tool: PendingTool | None = None


class AgentLightningCallbackHandler(BaseCallbackHandler):
    """Sets the current role during model runs and records tool runs. Registered globally by :func:`install`."""

    run_inline = True  # called in the caller's context (never in an executor), so the role it sets is seen
    raise_error = False

    def __init__(self) -> None:
        self._runs: dict[UUID, _Run] = {}
        # LangChain's own class names, and the size of sys.modules when they were listed: a framework class can
        # only appear with a newly imported module, so the (costly) walk of Runnable subclasses reruns only then.
        self._framework_names: tuple[int, frozenset[str]] = (-1, frozenset())

    def _remember(
        self,
        run_id: UUID,
        parent_run_id: UUID | None,
        name: str | None,
        tags: list[str] | None,
        metadata: dict[str, Any] | None,
    ) -> _Run:
        parent = self._runs.get(parent_run_id) if parent_run_id is not None else None
        metadata_role = (metadata or {}).get(ROLE_KEY)
        metadata_role = metadata_role if isinstance(metadata_role, str) and metadata_role else None
        tagged = [tag.removeprefix(ROLE_TAG_PREFIX) for tag in tags or [] if tag.startswith(ROLE_TAG_PREFIX)]
        tag_role = tagged[-1] if tagged else None
        explicit: str | None = None
        if metadata_role is not None and (parent is None or parent.metadata_role != metadata_role):
            explicit = metadata_role
        elif tag_role and (parent is None or parent.tag_role != tag_role):
            explicit = tag_role
        internal = name if name and _is_agent_node(name, tags, metadata) else None
        user_name = name if name and internal is None and not self._is_generic(name) else None
        recorder = current_recorder() or (parent.recorder if parent is not None else None)
        run = _Run(
            parent_run_id, explicit, user_name, internal, metadata_role, tag_role or None, recorder, current_role()
        )
        self._runs[run_id] = run
        return run

    def _is_generic(self, name: str) -> bool:
        """Whether ``name`` is a LangChain default (a class name of LangChain itself), not a name the user gave."""
        modules, names = self._framework_names
        if modules != len(sys.modules):
            modules = len(sys.modules)
            names = _framework_runnable_names()
            self._framework_names = (modules, names)
        return name.split("<", 1)[0] in names

    def _nearest(self, run: _Run | None, field: str) -> tuple[_Run | None, str | None]:
        """The nearest run from ``run`` up whose ``field`` is set, and that value."""
        while run is not None and getattr(run, field) is None:
            run = self._runs.get(run.parent_id) if run.parent_id is not None else None
        return run, getattr(run, field) if run is not None else None

    def _speaking(self, run: _Run | None, model_name: str | None = None, internal: bool = True) -> str | None:
        """The role speaking in ``run`` (see the module docstring; ``internal=False`` leaves out the agents' internal
        node names); an ``agl.role`` entered inside the run that names it wins, and so does one entered around runs
        that name nothing."""
        owner, role = self._nearest(run, "explicit")
        if owner is None:
            owner, role = self._nearest(run, "name")
        now = current_role()
        if owner is not None and (now is None or now == owner.role_at_start or owner is run):
            return role
        if now is not None:
            return now
        return model_name or (self._nearest(run, "internal")[1] if internal else None)

    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self._remember(run_id, parent_run_id, kwargs.get("name"), tags, metadata)

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._runs.pop(run_id, None)

    on_chain_error = on_chain_end  # type: ignore[assignment]  # (error, run_id=...): the same shape

    def on_chat_model_start(
        self,
        serialized: dict[str, Any] | None,
        messages: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        # A model run's `name` is only ever an explicit run_name (LangChain passes None otherwise). The model
        # instance's own name (`ChatOpenAI(name="writer")`) is the fallback when nothing around it names a role.
        run = self._remember(run_id, parent_run_id, kwargs.get("name"), tags, metadata)
        model_name = (serialized or {}).get("name")
        if not isinstance(model_name, str) or not model_name or self._is_generic(model_name):
            model_name = None
        role = self._speaking(run, model_name)
        if role is not None and role != current_role():  # prompts of one generate() share the role: set it once
            run.role_token = set_role(role)

    # Completion-style models (prompts instead of messages): LangChain passes both positionally, so one body serves.
    on_llm_start = on_chat_model_start  # type: ignore[assignment]

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        run = self._runs.pop(run_id, None)
        if run is not None and run.role_token is not None:
            reset_role(run.role_token)

    on_llm_error = on_llm_end  # type: ignore[assignment]

    def on_tool_start(
        self,
        serialized: dict[str, Any] | None,
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        inputs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        run = self._remember(run_id, parent_run_id, None, tags, metadata)
        if run.recorder is None:
            return
        parent = self._runs.get(parent_run_id) if parent_run_id is not None else None
        name = kwargs.get("name") or (serialized or {}).get("name") or "tool"
        # The role speaking around the tool, else (when None) the role of the LLM call that asked for it.
        run.tool = PendingTool(
            run.recorder,
            name=name,
            arguments=inputs if inputs is not None else input_str,
            role=self._speaking(parent, internal=False),
            adapter="langchain",
            tool_call_id=kwargs.get("tool_call_id"),
        )

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        run = self._runs.pop(run_id, None)
        if run is None or run.tool is None:
            return
        if isinstance(output, ToolMessage):
            failed = output.status == "error"
            run.tool.finish(output.content, error=f"ToolException: {output.content}" if failed else None)
        else:
            run.tool.finish(output)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        run = self._runs.pop(run_id, None)
        if run is not None and run.tool is not None:
            run.tool.finish(None, error=error_text(error))

    # Retrievers are tree nodes like chains (a named one can name a role); LangChain passes (serialized, query) and
    # (documents) positionally, so the chain callbacks serve.
    on_retriever_start = on_chain_start  # type: ignore[assignment]
    on_retriever_end = on_chain_end  # type: ignore[assignment]
    on_retriever_error = on_chain_error  # type: ignore[assignment]


def _is_agent_node(name: str, tags: list[str] | None, metadata: dict[str, Any] | None) -> bool:
    """Whether a run is a node LangGraph's agent factories build (its name names no agent of the user's)."""
    is_node = (metadata or {}).get("langgraph_node") == name and any(t.startswith("graph:step:") for t in tags or ())
    return is_node and (name in _AGENT_NODES or "." in name)


def _framework_runnable_names() -> frozenset[str]:
    """Class names of every Runnable defined by LangChain / LangGraph packages (their default run names)."""
    names = {"RunnableLambda", "<lambda>", "LangGraph"}
    stack: list[type] = [Runnable]
    seen: set[type] = set()
    while stack:
        cls = stack.pop()
        if cls in seen:
            continue
        seen.add(cls)
        if cls.__module__.split(".", 1)[0].startswith(("langchain", "langgraph")):
            names.add(cls.__name__)
        stack.extend(cls.__subclasses__())
    return frozenset(names)


_lock = threading.Lock()
_hook_var: ContextVar[AgentLightningCallbackHandler | None] | None = None


def install() -> None:
    """Register the handler for every LangChain run in this process. Idempotent."""
    global _hook_var
    with _lock:
        if _hook_var is not None:
            return
        handler = AgentLightningCallbackHandler()
        _hook_var = ContextVar("agl_langchain_handler", default=handler)
        tracer_context.register_configure_hook(_hook_var, inheritable=True)
        logger.debug("LangChain capture adapter installed")


def uninstall() -> None:
    """Remove the handler; runs started afterwards are no longer attributed. Idempotent."""
    global _hook_var
    with _lock:
        if _hook_var is None:
            return
        hooks = tracer_context._configure_hooks  # noqa: SLF001 - LangChain has no public unregister
        hooks[:] = [entry for entry in hooks if entry[0] is not _hook_var]
        _hook_var = None


def is_installed() -> bool:
    """Whether the handler is registered now."""
    return _hook_var is not None


def installed_handler() -> AgentLightningCallbackHandler | None:
    """The registered handler, or None when the adapter is not installed."""
    return _hook_var.get() if _hook_var is not None else None
