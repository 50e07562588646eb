"""Who may call the server: the server's token (``Authorization: Bearer <token>``) opens every route but ``/health``;
the key handed with a lease (``llm.api_key``) opens only its own rollout's proxy routes (``/rollouts/{id}/v1/...``),
so an agent cannot list, cancel or stop anything. A rollout's key is an HMAC of its id under the token: nothing is
stored, and it stays valid across a server restart with the same token. A token is required to listen beyond
loopback."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import ipaddress
from collections.abc import Callable

from fastapi import Request

from agentlightning.errors import AuthError
from agentlightning.server._errors import OpenAIError

ROLLOUT_KEY_PREFIX = "agl-rollout-"
_CHALLENGE = {"www-authenticate": "Bearer"}


def check_bind(host: str, token: str | None) -> None:
    """Refuse to serve on a non-loopback ``host`` without a token."""
    if token or host == "localhost":
        return
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(host).is_loopback:
            return
    raise AuthError(
        f"refusing to listen on {host!r} without a token: anyone who can reach it could read your data and "
        "use your model. Pass --token (or set AGL_SERVER_TOKEN), or bind to 127.0.0.1."
    )


def rollout_key(token: str, rollout_id: str) -> str:
    """The LLM api key handed with every lease of ``rollout_id`` by a server holding ``token``."""
    message = f"rollout:{rollout_id}".encode(errors="surrogatepass")
    return ROLLOUT_KEY_PREFIX + hmac.new(token.encode(), message, hashlib.sha256).hexdigest()[:48]


def bearer_token(token: str) -> Callable[[Request], None]:
    """A dependency refusing requests without ``Authorization: Bearer <token>`` (401) or with another credential,
    a rollout's key included (403)."""
    expected = token.encode()

    def check(request: Request) -> None:
        supplied = _bearer(request)
        if supplied is None:
            raise OpenAIError(
                401,
                "missing bearer token: send 'Authorization: Bearer <token>' (agl client --token, or AGL_SERVER_TOKEN)",
                "authentication_error",
                _CHALLENGE,
            )
        if hmac.compare_digest(supplied.encode(errors="surrogatepass"), expected):
            return
        if supplied.startswith(ROLLOUT_KEY_PREFIX):
            raise OpenAIError(
                403,
                f"a rollout's LLM key only opens its own /rollouts/<rollout_id>/v1/ routes, not {request.url.path}",
                "permission_error",
                _CHALLENGE,
            )
        raise OpenAIError(403, "invalid bearer token", "authentication_error", _CHALLENGE)

    return check


def rollout_access(token: str) -> Callable[[Request, str], None]:
    """A dependency of the proxy's routes: the server's token, or ``rollout_id``'s key, as a bearer token or the
    Anthropic SDK's ``x-api-key`` header (401 without one, 403 for any other)."""
    expected = token.encode()

    def check(request: Request, rollout_id: str) -> None:
        supplied = _bearer(request) or request.headers.get("x-api-key")
        if supplied is None:
            raise OpenAIError(
                401,
                "missing api key: call this endpoint with the llm.api_key handed with the rollout",
                "authentication_error",
                _CHALLENGE,
            )
        given = supplied.encode(errors="surrogatepass")
        if hmac.compare_digest(given, expected) or hmac.compare_digest(given, rollout_key(token, rollout_id).encode()):
            return
        raise OpenAIError(
            403,
            f"this api key does not open the LLM endpoint of rollout {rollout_id!r}: use the llm.api_key handed with "
            "that rollout (each rollout's key opens only its own endpoint)",
            "permission_error",
            _CHALLENGE,
        )

    return check


def _bearer(request: Request) -> str | None:
    """The credential of an ``Authorization: Bearer <credential>`` header; None without the header, ``""`` for
    another scheme (which opens nothing)."""
    header = request.headers.get("authorization")
    if header is None:
        return None
    scheme, _, credential = header.partition(" ")
    return credential.strip() if scheme.lower() == "bearer" else ""
