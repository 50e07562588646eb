"""What one request may cost: a body larger than the limit is answered with a 413 and never reaches a handler whole;
a large one is parsed, serialised and stored on a thread, so it does not stall the event loop for everyone else."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentlightning.server._errors import OpenAIError

LARGE = 1 << 20  # bytes


async def off_loop(size: int, func: Callable[..., Any], *args: Any) -> Any:
    """``func(*args)``: on a thread when ``size`` bytes of input make it slow, else right here on the event loop."""
    return await asyncio.to_thread(func, *args) if size > LARGE else func(*args)


class BodyLimitMiddleware:
    """Counts the body bytes a handler reads and raises a 413 :class:`OpenAIError` past ``max_bytes``, after
    reading the rest of the body (so the client sees the answer instead of a reset connection)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        size = 0

        async def limited() -> Message:
            nonlocal size
            message = await receive()
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                while message.get("more_body", False):
                    message = await receive()
                raise OpenAIError(413, f"request body of {size}+ bytes is larger than the server's limit of "
                                  f"{self.max_bytes} bytes (agl server --max-body-mb)", "invalid_request_error",
                                  {"connection": "close"})
            return message

        await self.app(scope, limited, send)
