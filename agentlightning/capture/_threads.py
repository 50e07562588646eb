"""The rollout follows the agent's work into thread pools: a task submitted to a ``ThreadPoolExecutor`` inside a
rollout (``pool.map``, ``pool.submit``, ``loop.run_in_executor``) runs in a copy of the submitter's context, so its
LLM calls land in that rollout. Python gives pool threads a fresh context otherwise."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import wrapt

from agentlightning.capture._context import current_recorder

_lock = threading.Lock()
_patched = False


def _submit_in_context(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
                       ) -> Any:
    if current_recorder() is None or not args:
        return wrapped(*args, **kwargs)
    return wrapped(contextvars.copy_context().run, *args, **kwargs)


def propagate_into_thread_pools() -> None:
    """Make ``ThreadPoolExecutor.submit`` carry the submitting rollout's context (idempotent)."""
    global _patched
    with _lock:
        if not _patched:
            wrapt.wrap_function_wrapper(ThreadPoolExecutor, "submit", _submit_in_context)
            _patched = True
