"""DSPy adapter: every model call of a DSPy program is captured, named after the predictor that makes it, and each
tool a ``dspy.ReAct`` agent runs is recorded with its status and the model call that chose it.

- DSPy's native engine (``dspy.LM`` with ``engine="auto"``, its default) sends its requests with lm15's own HTTP
  transport, which ``_lm15`` captures; with ``engine="litellm"`` they go through LiteLLM and the openai client, which
  the litellm, openai and httpx adapters capture. Either way each request is recorded once, with the server's token
  ids.
- ``Module.__call__`` / ``acall`` (every ``dspy.Module``: ``Predict``, ``ChainOfThought``, ``ReAct``, a user's own
  module, what ``dspy.Parallel`` and ``batch`` run in their threads): while a sub-module of the outermost running
  program runs, its name in that program (what ``named_sub_modules`` / ``named_predictors`` call it, without the
  ``.predict`` of a ``ChainOfThought``) is the current role: ``generate_query``, ``generate_answer``, ``react``,
  ``extract``. The outermost program itself sets no role, so an ``agl.role(...)`` around it names the calls of a lone
  predictor.
- ``Tool.__call__`` / ``acall``: each tool call (``finish``, ReAct's own last tool, included) becomes a
  ``kind="tool"`` call with the role of the ReAct predictor that chose it, linked to that predictor's latest model
  call (ReAct asks for tools in the text of its answer, with no tool-call id); a tool that raises is recorded with
  ``status="error"`` (ReAct then shows the error to the model).

DSPy's cache (``dspy.LM(cache=True)``, its default) answers a request it has seen before without calling the model:
such an answer is not captured, and training gets no new sample from it, so the adapter warns once when a program
runs in a rollout with a caching LM.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from agentlightning.adapters import _lm15
from agentlightning.adapters._stainless import Patch
from agentlightning.adapters._tools import PendingTool, error_text
from dspy.dsp.utils.settings import settings
from dspy.predict.react import ReAct

from agentlightning.capture import current_recorder, current_role, reset_role, set_role

logger = logging.getLogger(__name__)

# The role of every sub-module (by id) of the outermost program running in this context, and the modules running.
_names: ContextVar[dict[int, str] | None] = ContextVar("agl_dspy_names", default=None)
_running: ContextVar[tuple[Any, ...]] = ContextVar("agl_dspy_running", default=())
_cache_warned = threading.Event()


def _role_name(path: str) -> str | None:
    """``generate_answer`` for ``self.generate_answer.predict``; None for the program itself."""
    name = path.removesuffix(".predict")
    return None if name == "self" else name.removeprefix("self.")


def _sub_module_names(program: Any) -> dict[int, str]:
    try:
        pairs = list(program.named_sub_modules())
    except Exception:  # capture must never break the agent
        logger.exception("dspy adapter: could not list the sub-modules of %s", type(program).__name__)
        return {}
    return {id(module): name for path, module in pairs if (name := _role_name(path)) is not None}


def _warn_if_cached(program: Any) -> None:
    if _cache_warned.is_set():
        return
    predictors = program.predictors() if hasattr(program, "predictors") else []
    lms = [settings.lm, *(getattr(predictor, "lm", None) for predictor in predictors)]
    if any(getattr(lm, "cache", False) is True for lm in lms if lm is not None):
        _cache_warned.set()
        logger.warning(
            "DSPy program %s runs in a rollout with a caching LM (dspy.LM(cache=True), its default): a request it "
            "has answered before is answered from the cache without calling the model, so it is not captured and "
            "training gets no new sample from it. Pass dspy.LM(..., cache=False) to train.",
            type(program).__name__,
        )


@contextmanager
def _as_module(module: Any) -> Iterator[None]:
    """The module running, its name the current role (the outermost program's sub-modules are named first)."""
    names = _names.get()
    names_token = None
    if names is None:
        _warn_if_cached(module)
        names_token = _names.set(_sub_module_names(module))
        name = None
    else:
        name = names.get(id(module))
    role_token = set_role(name) if name is not None else None
    running_token = _running.set((*_running.get(), module))
    try:
        yield
    finally:
        _running.reset(running_token)
        if role_token is not None:
            reset_role(role_token)
        if names_token is not None:
            _names.reset(names_token)


def _module_call(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if current_recorder() is None:
        return wrapped(*args, **kwargs)
    with _as_module(instance):
        return wrapped(*args, **kwargs)


async def _module_acall(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if current_recorder() is None:
        return await wrapped(*args, **kwargs)
    with _as_module(instance):
        return await wrapped(*args, **kwargs)


def _tool_role() -> str | None:
    """The role of the ReAct predictor that chose the tool running now (else the current role)."""
    names = _names.get() or {}
    for module in reversed(_running.get()):
        if isinstance(module, ReAct) and id(module.react) in names:
            return names[id(module.react)]
    return current_role()


def _start_tool(tool: Any, kwargs: dict[str, Any]) -> PendingTool | None:
    recorder = current_recorder()
    if recorder is None:
        return None
    try:
        return PendingTool(recorder, str(tool.name), dict(kwargs), _tool_role(), "dspy", same_role=True)
    except Exception:  # capture must never break the agent
        logger.exception("dspy adapter: could not start recording tool %r", getattr(tool, "name", tool))
        return None


def _tool_call(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    pending = _start_tool(instance, kwargs)
    if pending is None:
        return wrapped(*args, **kwargs)
    try:
        result = wrapped(*args, **kwargs)
    except Exception as exc:
        pending.finish(None, error=error_text(exc))
        raise
    pending.finish(result)
    return result


async def _tool_acall(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    pending = _start_tool(instance, kwargs)
    if pending is None:
        return await wrapped(*args, **kwargs)
    try:
        result = await wrapped(*args, **kwargs)
    except Exception as exc:
        pending.finish(None, error=error_text(exc))
        raise
    pending.finish(result)
    return result


_PATCH = Patch(
    extra=(
        (_lm15.TRANSPORTS, "StdlibTransport", "stream", _lm15.stream),
        (_lm15.TRANSPORTS, "StdlibAsyncTransport", "stream", _lm15.astream),
        ("dspy.primitives.module", "Module", "__call__", _module_call),
        ("dspy.primitives.module", "Module", "acall", _module_acall),
        ("dspy.adapters.types.tool", "Tool", "__call__", _tool_call),
        ("dspy.adapters.types.tool", "Tool", "acall", _tool_acall),
    )
)
install, uninstall, is_installed = _PATCH.install, _PATCH.uninstall, _PATCH.is_installed
