"""The worker protocol's HTTP transport: keep-alive HTTP/1.1 over ``http.client``, thread-safe.

Every rollout costs a worker one or two requests to the server (the result upload, which takes the next lease,
and a dequeue when it brought none); httpx spends about 0.7 ms of CPU on each, ``http.client`` a fraction of that.
:class:`KeepAliveHTTP` keeps idle connections in a small pool, sends each request in one write (``http.client``
joins headers and a bytes body) and resends once on a fresh connection when a reused one turns out to have been
closed by the server. A server URL that the environment routes
through a proxy (``HTTP_PROXY`` ...) goes through httpx instead (:class:`HttpxTransport`), as before.
"""

from __future__ import annotations

import http.client
import ssl
import threading
from typing import Protocol
from urllib.parse import urlencode, urlsplit

import httpx

# A reused connection failing with one of these before any answer byte was closed by the server while idle.
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


class TransportError(Exception):
    """The request could not be sent or its answer not read (connection refused, reset, timed out)."""


class Transport(Protocol):
    """What :class:`~agentlightning.client.api.ServerAPI` needs: one request, answered with (status, body)."""

    def request(
        self, method: str, path: str, *, body: bytes | None, headers: dict[str, str], params: dict[str, object] | None,
        timeout: float,
    ) -> tuple[int, bytes]:
        """Send ``method path`` (relative to the base URL); raises :class:`TransportError`."""

    def close(self) -> None:
        """Close the connections."""


class KeepAliveHTTP:
    """A pool of keep-alive ``http.client`` connections to one server (see the module docstring)."""

    def __init__(self, base_url: str, headers: dict[str, str], max_idle: int = 8) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"server URL must be http(s)://host[:port], got {base_url!r}")
        self._tls = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._tls else 80)
        self._prefix = parts.path.rstrip("/")
        self._headers = headers
        self._max_idle = max_idle
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._ssl: ssl.SSLContext | None = None

    def request(
        self, method: str, path: str, *, body: bytes | None, headers: dict[str, str], params: dict[str, object] | None,
        timeout: float,
    ) -> tuple[int, bytes]:
        target = self._prefix + path + (f"?{urlencode(params)}" if params else "")
        all_headers = {**self._headers, **headers}
        if body is None and method in ("POST", "PUT", "PATCH"):
            all_headers["content-length"] = "0"
        while True:
            connection, reused = self._take(timeout)
            try:
                connection.request(method, target, body=body, headers=all_headers)
                response = connection.getresponse()
                data = response.read()
            except _STALE as exc:
                connection.close()
                if reused:  # the server dropped the idle connection: resend once, on a fresh one
                    continue
                raise TransportError(f"{type(exc).__name__}: {exc}") from None
            except (OSError, http.client.HTTPException) as exc:
                connection.close()
                raise TransportError(f"{type(exc).__name__}: {exc}") from None
            if response.will_close:
                connection.close()
            else:
                self._give_back(connection)
            return response.status, data

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    def _take(self, timeout: float) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            connection = self._idle.pop() if self._idle else None
        if connection is not None:
            connection.timeout = timeout
            if connection.sock is not None:
                connection.sock.settimeout(timeout)
            return connection, True
        if self._tls:
            if self._ssl is None:
                self._ssl = httpx.create_ssl_context()  # the CA bundle and SSL_CERT_* variables httpx used
            return http.client.HTTPSConnection(self._host, self._port, timeout=timeout, context=self._ssl), False
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout), False

    def _give_back(self, connection: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < self._max_idle:
                self._idle.append(connection)
                return
        connection.close()


class HttpxTransport:
    """The :class:`Transport` interface over httpx (used when an environment proxy applies to the server URL)."""

    def __init__(self, base_url: str, headers: dict[str, str]) -> None:
        self._client = httpx.Client(base_url=base_url, headers=headers)

    def request(
        self, method: str, path: str, *, body: bytes | None, headers: dict[str, str], params: dict[str, object] | None,
        timeout: float,
    ) -> tuple[int, bytes]:
        try:
            response = self._client.request(
                method, path, content=body, headers=headers, params=params, timeout=timeout  # type: ignore[arg-type]
            )
        except httpx.TransportError as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from None
        return response.status_code, response.content

    def close(self) -> None:
        self._client.close()
