"""Bearer-token authentication, required whenever the server listens beyond loopback."""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
from collections.abc import Callable

from fastapi import Request

from agentlightning.server._errors import OpenAIError


class AuthError(RuntimeError):
    """The server was asked to listen publicly without a token."""


def check_bind(host: str, token: str | None) -> None:
    """Refuse to serve on a non-loopback ``host`` without a token."""
    if token or host == "localhost":
        return
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(host).is_loopback:
            return
    raise AuthError(
        f"refusing to listen on {host!r} without a token: anyone who can reach it could read your data and use "
        "your model. Pass --token (or set AGL_SERVER_TOKEN), or bind to 127.0.0.1."
    )


def bearer_token(token: str) -> Callable[[Request], None]:
    """A dependency refusing requests without ``Authorization: Bearer <token>`` (401) or with a wrong one (403)."""
    expected = f"Bearer {token}".encode()

    def check(request: Request) -> None:
        supplied = request.headers.get("authorization")
        if supplied is None:
            raise OpenAIError(401, "missing bearer token: send 'Authorization: Bearer <token>' (agl client --token, "
                              "or AGL_SERVER_TOKEN)", "authentication_error", {"www-authenticate": "Bearer"})
        if not hmac.compare_digest(supplied.encode(), expected):
            raise OpenAIError(403, "invalid bearer token", "authentication_error", {"www-authenticate": "Bearer"})

    return check
