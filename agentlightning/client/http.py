"""The worker protocol's HTTP transport: keep-alive HTTP/1.1 over plain sockets, thread-safe.

Every rollout costs a worker one or two requests to the server (the result upload, which takes the next lease,
and a dequeue when it brought none). httpx spends about 0.7 ms of CPU on each; ``http.client`` spends most of its
0.3 ms parsing the answer's headers with the ``email`` package. :class:`KeepAliveHTTP` writes each request in one
send and reads the answer itself (status line, headers, a Content-Length or chunked body), keeps idle connections
in a small pool and resends once on a fresh connection when a reused one turns out to have been closed by the
server before answering. A server URL that the environment routes through a proxy (``HTTP_PROXY`` ...) goes through
httpx instead (:class:`HttpxTransport`).
"""

from __future__ import annotations

import socket
import ssl
import threading
from typing import Protocol
from urllib.parse import urlencode, urlsplit

import httpx

# A reused connection failing with one of these before any answer byte was closed by the server while idle.
_STALE = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)
_MAX_HEAD = 64 * 1024


class TransportError(Exception):
    """The request could not be sent or its answer not read (connection refused, reset, timed out)."""


class _ClosedBeforeAnswer(ConnectionError):
    """The server closed the connection without sending a byte of the answer."""


class Transport(Protocol):
    """What :class:`~agentlightning.client.api.ServerAPI` needs: one request, answered with (status, body)."""

    def request(
        self, method: str, path: str, *, body: bytes | None, headers: dict[str, str], params: dict[str, object] | None,
        timeout: float,
    ) -> tuple[int, bytes]:
        """Send ``method path`` (relative to the base URL); raises :class:`TransportError`."""

    def close(self) -> None:
        """Close the connections."""


class _Connection:
    """One HTTP/1.1 connection: a request written at once, its answer read by length, by chunks or to the end."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._pending = b""

    def exchange(self, request: bytes, method: str, timeout: float) -> tuple[int, bytes, bool]:
        """(status, body, whether the connection can be reused) of ``request``."""
        self.sock.settimeout(timeout)
        self.sock.sendall(request)
        while True:
            status, headers, version = self._read_head()
            if not 100 <= status < 200:
                break
        keep = version != b"HTTP/1.0" and b"close" not in headers.get(b"connection", b"").lower()
        if method == "HEAD" or status in (204, 304):
            return status, b"", keep
        if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
            return status, self._read_chunked(), keep
        length = headers.get(b"content-length")
        if length is not None:
            return status, self._read_exactly(int(length)), keep
        return status, self._read_to_end(), False

    def close(self) -> None:
        self.sock.close()

    def _recv(self) -> bytes:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("the server closed the connection in the middle of its answer")
        return data

    def _read_head(self) -> tuple[int, dict[bytes, bytes], bytes]:
        buffer = self._pending
        while (end := buffer.find(b"\r\n\r\n")) < 0:
            if len(buffer) > _MAX_HEAD:
                raise ConnectionError(f"answer headers longer than {_MAX_HEAD} bytes")
            data = self.sock.recv(65536)
            if not data:
                if buffer:
                    raise ConnectionError("the server closed the connection in the middle of its answer")
                raise _ClosedBeforeAnswer("the server closed the connection without answering")
            buffer += data
        head, self._pending = buffer[:end], buffer[end + 4:]
        status_line, *lines = head.split(b"\r\n")
        version, _, rest = status_line.partition(b" ")
        if not version.startswith(b"HTTP/") or not rest[:3].isdigit():
            raise ConnectionError(f"not an HTTP answer: {status_line[:80]!r}")
        headers: dict[bytes, bytes] = {}
        for line in lines:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        return int(rest[:3]), headers, version

    def _read_exactly(self, size: int) -> bytes:
        buffer = self._pending
        while len(buffer) < size:
            buffer += self._recv()
        self._pending = buffer[size:]
        return buffer[:size]

    def _read_line(self) -> bytes:
        buffer = self._pending
        while (end := buffer.find(b"\r\n")) < 0:
            buffer += self._recv()
        self._pending = buffer[end + 2:]
        return buffer[:end]

    def _read_chunked(self) -> bytes:
        chunks: list[bytes] = []
        while True:
            size = int(self._read_line().split(b";", 1)[0].strip(), 16)
            if size == 0:
                while self._read_line():  # trailers, up to the empty line
                    pass
                return b"".join(chunks)
            chunks.append(self._read_exactly(size))
            self._read_line()

    def _read_to_end(self) -> bytes:
        chunks = [self._pending]
        self._pending = b""
        while data := self.sock.recv(65536):
            chunks.append(data)
        return b"".join(chunks)


class KeepAliveHTTP:
    """A pool of keep-alive connections to one server (see the module docstring)."""

    def __init__(self, base_url: str, headers: dict[str, str], max_idle: int = 8) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"server URL must be http(s)://host[:port], got {base_url!r}")
        if any("\r" in f"{k}{v}" or "\n" in f"{k}{v}" for k, v in headers.items()):
            raise ValueError("header names and values must not contain line breaks")
        self._tls = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._tls else 80)
        self._prefix = parts.path.rstrip("/")
        self._head = "".join(f"{name}: {value}\r\n" for name, value in {
            "host": parts.netloc.rpartition("@")[2], "accept-encoding": "identity", **headers}.items())
        self._max_idle = max_idle
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()
        self._ssl: ssl.SSLContext | None = None

    def request(
        self, method: str, path: str, *, body: bytes | None, headers: dict[str, str], params: dict[str, object] | None,
        timeout: float,
    ) -> tuple[int, bytes]:
        target = self._prefix + path + (f"?{urlencode(params)}" if params else "")
        head = f"{method} {target} HTTP/1.1\r\n{self._head}"
        head += "".join(f"{name}: {value}\r\n" for name, value in headers.items() if name.lower() != "content-length")
        if body is not None or method in ("POST", "PUT", "PATCH"):
            head += f"content-length: {len(body or b'')}\r\n"
        message = (head + "\r\n").encode("latin-1") + (body or b"")
        while True:
            try:
                connection, reused = self._take(timeout)
            except OSError as exc:
                raise TransportError(f"{type(exc).__name__}: {exc}") from None
            try:
                status, data, keep = connection.exchange(message, method, timeout)
            except (_ClosedBeforeAnswer, *_STALE) as exc:
                connection.close()
                if reused:  # the server dropped the idle connection: resend once, on a fresh one
                    continue
                raise TransportError(f"{type(exc).__name__}: {exc}") from None
            except (OSError, ValueError) as exc:
                connection.close()
                raise TransportError(f"{type(exc).__name__}: {exc}") from None
            if keep:
                self._give_back(connection)
            else:
                connection.close()
            return status, data

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    def _take(self, timeout: float) -> tuple[_Connection, bool]:
        with self._lock:
            connection = self._idle.pop() if self._idle else None
        if connection is not None:
            return connection, True
        sock = socket.create_connection((self._host, self._port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._tls:
            if self._ssl is None:
                self._ssl = httpx.create_ssl_context()  # the CA bundle and SSL_CERT_* variables httpx used
            try:
                sock = self._ssl.wrap_socket(sock, server_hostname=self._host)
            except OSError:
                sock.close()
                raise
        return _Connection(sock), False

    def _give_back(self, connection: _Connection) -> None:
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
