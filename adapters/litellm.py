"""Capture of LiteLLM: its calls to OpenAI-compatible servers go through the openai client (``client.post``), where
the openai and httpx adapters record them; this adapter keeps LiteLLM's own model string (``"openai/qwen"``,
``"hosted_vllm/qwen"``: the request on the wire names only ``"qwen"``) in ``Call.metadata["litellm_model"]``, for
every call made inside ``litellm.completion`` / ``acompletion`` / ``responses`` / ``aresponses`` (streamed too: the
request is sent before they return)."""

from __future__ import annotations

import threading
from typing import Any

import litellm
import wrapt

from agentlightning.capture import call_metadata

_ENTRY_POINTS = ("completion", "acompletion", "responses", "aresponses")
_lock = threading.Lock()
_originals: dict[str, Any] = {}


def _model(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return kwargs["model"] if "model" in kwargs else args[0] if args else None


def _sync(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    with call_metadata(litellm_model=_model(args, kwargs)):
        return wrapped(*args, **kwargs)


async def _async(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    with call_metadata(litellm_model=_model(args, kwargs)):
        return await wrapped(*args, **kwargs)


def install() -> None:
    """Wrap LiteLLM's entry points (idempotent)."""
    with _lock:
        if _originals:
            return
        for name in _ENTRY_POINTS:
            original = getattr(litellm, name, None)
            if original is not None:
                _originals[name] = original
                setattr(litellm, name, wrapt.FunctionWrapper(original, _async if name.startswith("a") else _sync))


def uninstall() -> None:
    """Restore LiteLLM's entry points (idempotent)."""
    with _lock:
        for name, original in _originals.items():
            setattr(litellm, name, original)
        _originals.clear()


def is_installed() -> bool:
    """Whether the entry points are wrapped."""
    return bool(_originals)
