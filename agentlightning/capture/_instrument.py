"""Which capture adapters exist, and installing them when their framework is (or gets) imported.

Each adapter module in ``agentlightning.adapters`` exposes ``install()``, ``uninstall()`` (both idempotent) and
``is_installed()``. The adapter is the only record of whether it is installed: the registry asks it, so calling an
adapter's ``install`` / ``uninstall`` directly and going through :func:`instrument` never disagree.
``enable_auto_instrumentation()`` runs when a rollout starts: it installs every adapter whose framework is
already imported, and registers a post-import hook for the others so that a framework imported later (for
example inside the agent function) is instrumented the moment it is imported. Importing Agent Lightning never
imports a framework by itself.
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
from dataclasses import dataclass
from types import ModuleType

import wrapt

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AdapterSpec:
    """An adapter: the framework module that triggers it and the module implementing it."""

    name: str
    trigger_module: str
    adapter_module: str


ADAPTERS: dict[str, AdapterSpec] = {
    spec.name: spec
    for spec in (
        AdapterSpec("openai", "openai", "agentlightning.adapters.openai"),
        AdapterSpec("langchain", "langchain_core", "agentlightning.adapters.langchain"),
        AdapterSpec("openai_agents", "agents", "agentlightning.adapters.openai_agents"),
        AdapterSpec("autogen", "autogen_agentchat", "agentlightning.adapters.autogen"),
    )
}

_lock = threading.RLock()
_hooks_registered = False


def _spec(name: str) -> AdapterSpec:
    try:
        return ADAPTERS[name]
    except KeyError:
        raise ValueError(f"unknown adapter {name!r}; known adapters: {sorted(ADAPTERS)}") from None


def instrument(name: str) -> None:
    """Install the adapter ``name`` ('openai', 'langchain', 'openai_agents', 'autogen') now.

    Raises ``ImportError`` with the extra to install when its framework is missing. Installing twice is harmless.
    """
    spec = _spec(name)
    with _lock:
        try:
            importlib.import_module(spec.trigger_module)
        except ImportError as exc:
            extra = {"openai_agents": "openai-agents"}.get(name, name)
            raise ImportError(
                f"agl.instrument({name!r}) needs {spec.trigger_module!r}: pip install 'agentlightning[{extra}]'"
            ) from exc
        importlib.import_module(spec.adapter_module).install()
        logger.debug("installed capture adapter %s", name)


def _adapter(spec: AdapterSpec) -> ModuleType | None:
    """The adapter module, or None while its framework is not imported (then it cannot be installed)."""
    if spec.trigger_module not in sys.modules:
        return None
    return importlib.import_module(spec.adapter_module)


def uninstrument(name: str) -> None:
    """Remove the adapter ``name`` and restore the framework's original behaviour."""
    with _lock:
        adapter = _adapter(_spec(name))
        if adapter is not None:
            adapter.uninstall()


def installed_adapters() -> list[str]:
    """Names of the adapters installed now."""
    return sorted(name for name, spec in ADAPTERS.items() if (adapter := _adapter(spec)) and adapter.is_installed())


def _install_on_import(name: str) -> None:
    def hook(_module: ModuleType) -> None:
        try:
            instrument(name)
        except Exception:  # capture must never break the user's import
            logger.exception("could not install the %s capture adapter; its calls will not be attributed", name)

    wrapt.register_post_import_hook(hook, ADAPTERS[name].trigger_module)


def enable_auto_instrumentation() -> None:
    """Install adapters for imported frameworks now, and for the others as soon as they are imported."""
    global _hooks_registered
    with _lock:
        if _hooks_registered:
            return
        _hooks_registered = True
    for name in ADAPTERS:
        _install_on_import(name)
