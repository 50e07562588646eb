"""Bearer-token authentication, required whenever the server listens beyond loopback."""

from __future__ import annotations

import hmac
import ipaddress
import json

from starlette.types import ASGIApp, Receive, Scope, Send

# Paths anyone may read (load balancers and probes do not carry tokens).
OPEN_PATHS = frozenset({"/health"})


class AuthError(RuntimeError):
    """The server was asked to listen publicly without a token."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """Refuse to serve on a non-loopback ``host`` without a token."""
    if not is_loopback(host) and not token:
        raise AuthError(
            f"refusing to listen on {host!r} without a token: anyone who can reach it could read your data and use "
            "your model. Pass --token (or set AGL_SERVER_TOKEN), or bind to 127.0.0.1."
        )


class AuthMiddleware:
    """Rejects requests without ``Authorization: Bearer <token>`` (401) or with a wrong one (403)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        supplied = next((value for name, value in scope["headers"] if name == b"authorization"), None)
        if supplied is None:
            await _deny(send, 401, "missing bearer token: send 'Authorization: Bearer <token>' (agl client --token, "
                        "or AGL_SERVER_TOKEN)")
            return
        if not hmac.compare_digest(supplied, self._expected):
            await _deny(send, 403, "invalid bearer token")
            return
        await self.app(scope, receive, send)


async def _deny(send: Send, status: int, message: str) -> None:
    body = json.dumps({"error": {"message": message, "type": "authentication_error", "code": status}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"www-authenticate", b"Bearer")]})
    await send({"type": "http.response.body", "body": body})
