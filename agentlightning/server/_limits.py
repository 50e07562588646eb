"""Request size limit: a body larger than the limit is answered with a 413 and never reaches a handler whole."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentlightning.server._errors import OpenAIError


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
