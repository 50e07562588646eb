"""``agl.role``: name the component that is speaking, for hand-written agents."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from contextvars import Token
from types import TracebackType
from typing import Any, TypeVar

from agentlightning.context import reset_role, set_role

F = TypeVar("F", bound=Callable[..., Any])


class role:  # noqa: N801 - used like a function: `with agl.role("writer"):`
    """Attribute the LLM calls made inside to ``name``.

    Works as a context manager (sync and async) and as a decorator of sync or async functions::

        with agl.role("writer"):
            client.chat.completions.create(...)

        @agl.role("checker")
        def check(sql: str) -> str: ...
    """

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"agl.role: name must be a non-empty string, got {name!r}")
        self.name = name
        self._tokens: list[Token[str | None]] = []

    def __enter__(self) -> role:
        self._tokens.append(set_role(self.name))
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        reset_role(self._tokens.pop())

    async def __aenter__(self) -> role:
        return self.__enter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.__exit__(exc_type, exc, tb)

    def __call__(self, func: F) -> F:
        name = self.name
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                with role(name):
                    return await func(*args, **kwargs)

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with role(name):
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]
