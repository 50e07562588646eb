"""Roles: ``agl.role`` names the component that is speaking (selecting roles by name or glob is
:func:`agentlightning.types.role_matches`)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from contextvars import ContextVar, Token
from typing import Any, TypeVar

from agentlightning.capture._context import reset_role, set_role

F = TypeVar("F", bound=Callable[..., Any])

# The roles entered in this context, innermost last, with the token that undoes each. Context-local, so one role
# object shared by concurrent tasks or threads (`WRITER = agl.role("writer")`) undoes each entry where it was made.
_entered: ContextVar[tuple[tuple[role, Token[str | None]], ...]] = ContextVar("agl_roles_entered", default=())


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

    def __enter__(self) -> role:
        _entered.set((*_entered.get(), (self, set_role(self.name))))
        return self

    def __exit__(self, *exc_info: object) -> None:
        entered = _entered.get()
        for position in range(len(entered) - 1, -1, -1):
            owner, token = entered[position]
            if owner is self:
                _entered.set(entered[:position] + entered[position + 1 :])
                reset_role(token)
                return

    async def __aenter__(self) -> role:
        return self.__enter__()

    async def __aexit__(self, *exc_info: object) -> None:
        self.__exit__()

    def __call__(self, func: F) -> F:
        # The object itself is entered on every call: entries are context-local, so concurrent calls are safe.
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                with self:
                    return await func(*args, **kwargs)

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]
