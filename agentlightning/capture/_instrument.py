"""Which capture adapters exist, and installing them when their framework is (or gets) imported.

Each adapter module ``agentlightning.adapters.<name>`` exposes idempotent ``install()`` / ``uninstall()`` and
``is_installed()`` (the only record of whether it is installed). A task submitted to a ``ThreadPoolExecutor`` inside a
rollout (``pool.map``, ``pool.submit``, ``loop.run_in_executor``) runs in a copy of the submitter's context, so its
LLM calls land in that rollout (Python gives pool threads a fresh context otherwise)."""

from __future__ import annotations

import contextvars
import functools
import importlib
import importlib.metadata
import logging
import sys
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import wrapt

from agentlightning.capture._context import current_recorder

logger = logging.getLogger(__name__)

# adapter name (its module in agentlightning.adapters) -> the framework module that triggers it
ADAPTERS: dict[str, str] = {
    "openai": "openai",
    "httpx": "httpx",
    "httpx2": "httpx2",
    "anthropic": "anthropic",
    "langchain": "langchain_core",
    "openai_agents": "agents",
    "autogen": "autogen_agentchat",
    "pydantic_ai": "pydantic_ai",
    "litellm": "litellm",
    "agent_framework": "agent_framework",
    "crewai": "crewai",
    "llama_index": "llama_index.core",
    "smolagents": "smolagents",
    "google_adk": "google.adk",
    "dspy": "dspy",
}

_lock = threading.RLock()
_hooks_registered = False


def _trigger(name: str) -> str:
    try:
        return ADAPTERS[name]
    except KeyError:
        raise ValueError(f"unknown adapter {name!r}; known adapters: {sorted(ADAPTERS)}") from None


def instrument(name: str) -> None:
    """Install the adapter ``name`` ('openai', 'httpx', 'httpx2', 'anthropic', 'langchain', 'openai_agents',
    'autogen', 'pydantic_ai', 'litellm', 'agent_framework', 'crewai', 'llama_index', 'smolagents', 'google_adk',
    'dspy') now.

    Raises ``ImportError`` with the extra to install when its framework is missing. Installing twice is harmless.
    """
    trigger = _trigger(name)
    with _lock:
        try:
            importlib.import_module(trigger)
        except ImportError as exc:
            extras = {
                "openai_agents": "openai-agents",
                "pydantic_ai": "pydantic-ai",
                "agent_framework": "agent-framework",
                "llama_index": "llama-index",
                "google_adk": "google-adk",
            }
            extra = extras.get(name, name)
            message = f"agl.instrument({name!r}) needs {trigger!r}: pip install 'agentlightning-rl[{extra}]'"
            raise ImportError(message) from exc
        importlib.import_module(f"agentlightning.adapters.{name}").install()
        logger.debug("installed capture adapter %s", name)


def _adapter(name: str) -> ModuleType | None:
    """The adapter module, or None while its framework is not imported (then it cannot be installed)."""
    if _trigger(name) not in sys.modules:
        return None
    return importlib.import_module(f"agentlightning.adapters.{name}")


def uninstrument(name: str) -> None:
    """Remove the adapter ``name`` and restore the framework's original behaviour."""
    with _lock:
        adapter = _adapter(name)
        if adapter is not None:
            adapter.uninstall()


def installed_adapters() -> list[str]:
    """Names of the adapters installed now."""
    return sorted(name for name in ADAPTERS if (adapter := _adapter(name)) and adapter.is_installed())


@functools.cache
def _distributions() -> Mapping[str, list[str]]:
    return importlib.metadata.packages_distributions()


def _shadows_framework(module: ModuleType) -> bool:
    """Whether ``module`` is a file of the user's own that has a framework's name (an ``agents.py`` beside their
    script is not the OpenAI Agents SDK). Modules under site-packages are installed ones; elsewhere, the module is the
    framework when a distribution that provides its name holds this file, or holds no such file (an editable install).
    """
    origin = getattr(module, "__file__", None)
    if origin is None or {"site-packages", "dist-packages"} & set(Path(origin).parts):
        return False  # installed, or a namespace package (only distributions make those)
    here = Path(origin).resolve()
    parts = module.__name__.split(".")
    candidates = ["/".join(parts) + ".py", "/".join([*parts, "__init__.py"])]
    held_elsewhere = False
    for distribution in _distributions().get(parts[0], []):
        for candidate in candidates:
            path = Path(str(importlib.metadata.distribution(distribution).locate_file(candidate)))
            if path.resolve() == here:
                return False
            held_elsewhere = held_elsewhere or path.exists()
    return held_elsewhere or parts[0] not in _distributions()


def _install_on_import(name: str) -> None:
    def hook(module: ModuleType) -> None:
        if _shadows_framework(module):
            logger.debug("%s (%s) is not the framework of the %s adapter", module.__name__, module.__file__, name)
            return
        try:
            instrument(name)
        except Exception:  # capture must never break the user's import
            logger.exception("could not install the %s capture adapter; its calls will not be attributed", name)

    wrapt.register_post_import_hook(hook, ADAPTERS[name])


def enable_auto_instrumentation() -> None:
    """Install adapters for imported frameworks now, and for the others as soon as they are imported; make thread
    pools carry the rollout's context."""
    global _hooks_registered
    with _lock:
        if _hooks_registered:
            return
        _hooks_registered = True
        wrapt.wrap_function_wrapper(ThreadPoolExecutor, "submit", _submit_in_context)
    for name in ADAPTERS:
        _install_on_import(name)


def _submit_in_context(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    if current_recorder() is None or not args:
        return wrapped(*args, **kwargs)
    return wrapped(contextvars.copy_context().run, *args, **kwargs)
