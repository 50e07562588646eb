"""The proxy's upstream HTTP client: lean keep-alive HTTP/1.1 over asyncio, parsed by httptools.

A general client (httpx) spends about 1 ms of CPU per request on layers the proxy does not need; the proxy sends
one POST per LLM call to one upstream. :class:`UpstreamClient` keeps a pool of idle connections per
(scheme, host, port), writes each request in one send, parses answers with httptools (Content-Length, chunked and
read-until-close bodies) and returns either the whole body or a stream of body chunks.

Errors are typed so the proxy can tell what is safe to retry: :class:`ConnectError` (nothing was sent),
:class:`RemoteProtocolError` (the connection closed or answered garbage before a complete answer) and
:class:`ReadTimeout` (the upstream went silent for ``timeout`` seconds). A keep-alive connection that the upstream
closed while idle is detected when the request gets no byte back, and the request is resent once on a fresh
connection, as browsers and urllib3 do.

Environment proxies (``HTTP_PROXY``/``HTTPS_PROXY``/``ALL_PROXY``) are not spoken here: :func:`env_proxy_for`
tells the caller when an upstream must go through one (the proxy then uses :class:`HttpxUpstreamClient`).
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
import time
import urllib.request
from collections.abc import AsyncIterator
from typing import Protocol
from urllib.parse import urlsplit

import httptools
import httpx

# A streaming reader stops reading from the socket while this many bytes wait for the consumer.
_STREAM_HIGH_WATER = 256 * 1024


class HTTPError(Exception):
    """Base of the client's transport errors (HTTP error statuses are answers, not exceptions)."""


class ConnectError(HTTPError):
    """The connection could not be opened (refused, unresolvable, TLS failure); nothing was sent."""


class ConnectTimeout(ConnectError):
    """The connection was not established within the connect timeout."""


class RemoteProtocolError(HTTPError):
    """The upstream closed the connection or sent a malformed answer before the answer was complete."""


class ReadTimeout(HTTPError):
    """The upstream sent nothing for ``timeout`` seconds while an answer was due."""


class UpstreamResponse(Protocol):
    """An answer: status, headers, then the body whole (:meth:`aread`) or in chunks (:meth:`aiter_raw`)."""

    status_code: int

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (lower case), or None."""

    async def aread(self) -> bytes:
        """The whole body (after transfer decoding)."""

    def aiter_raw(self) -> AsyncIterator[bytes]:
        """Body chunks as they arrive."""

    async def aclose(self) -> None:
        """Release the connection (reused when the answer was complete and keep-alive)."""


class UpstreamHTTP(Protocol):
    """What the proxy needs from an HTTP client."""

    async def post(self, url: str, body: bytes, headers: dict[str, str], *, stream: bool = False) -> UpstreamResponse:
        """POST ``body``; returns once the headers (``stream=True``) or the whole answer arrived."""

    async def aclose(self) -> None:
        """Close every connection."""


def env_proxy_for(url: str) -> str | None:
    """The environment proxy (``*_PROXY``, honouring ``NO_PROXY``) that requests to ``url`` must go through."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if not proxy or urllib.request.proxy_bypass_environment(parts.hostname or "", proxies):
        return None
    return proxy


class _Target:
    """A parsed request URL: pool key, Host header and request target."""

    __slots__ = ("key", "host", "port", "tls", "head")

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"upstream URL must be http(s)://host[:port]/path, got {url!r}")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        self.key = (parts.scheme, self.host, self.port)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        default_port = (self.tls and self.port == 443) or (not self.tls and self.port == 80)
        authority = self.host if ":" not in self.host else f"[{self.host}]"
        if not default_port:
            authority = f"{authority}:{self.port}"
        self.head = f" {target} HTTP/1.1\r\nhost: {authority}\r\n"


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection; at most one exchange in flight. Also the httptools parser's callback object."""

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout: float) -> None:
        self._loop = loop
        self._timeout = timeout
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reused = False
        self.idle_since = 0.0
        self._busy = False
        self._received = False
        self._last_data = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._headers_future: asyncio.Future[None] | None = None
        self._done_future: asyncio.Future[None] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        self._streaming = False
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.complete = False
        self.error: HTTPError | None = None
        self.keep_alive = False
        self._framed = False

    # -- asyncio.Protocol ---------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if not self._busy:  # nothing asked for: the connection cannot be trusted any more
            self.close()
            return
        self._received = True
        self._last_data = self._loop.time()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(RemoteProtocolError(f"malformed HTTP answer from the upstream: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self._busy or self.complete:
            return
        if self._headers_future is not None and self._headers_future.done() and not self._framed:
            self.on_message_complete()  # a body delimited by the end of the connection
            return
        detail = f": {exc}" if exc else ""
        if self._received:
            self._fail(RemoteProtocolError(f"upstream closed the connection in the middle of the answer{detail}"))
        else:
            self._fail(RemoteProtocolError(f"upstream closed the connection without answering{detail}"))

    # -- httptools callbacks -----------------------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-length" or (name == b"transfer-encoding" and b"chunked" in value.lower()):
            self._framed = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self.keep_alive = self._parser.should_keep_alive()
        if self.status in (204, 304) or 100 <= self.status < 200:
            self._framed = True
        if self._headers_future is not None and not self._headers_future.done():
            self._headers_future.set_result(None)

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self._streaming and self.buffered > _STREAM_HIGH_WATER and self.transport is not None and not self._paused:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self._stop_timer()
        if self._headers_future is not None and not self._headers_future.done():
            self._headers_future.set_result(None)
        if self._done_future is not None and not self._done_future.done():
            self._done_future.set_result(None)
        self._wake()

    # -- exchange ------------------------------------------------------------------------------------------------

    def send(self, request: bytes, streaming: bool) -> None:
        """Start an exchange: reset the state and write ``request`` in one piece. A ``streaming`` exchange stops
        reading while its consumer lags; otherwise the whole body is buffered."""
        assert self.transport is not None and not self._busy
        self._busy = True
        self._streaming = streaming
        self._received = False
        self.status = 0
        self.headers = []
        self.chunks = deque()
        self.buffered = 0
        self.complete = False
        self.error = None
        self._framed = False
        self._headers_future = self._loop.create_future()
        self._done_future = self._loop.create_future()
        self._last_data = self._loop.time()
        self._timer = self._loop.call_at(self._last_data + self._timeout, self._check_timeout)
        self.transport.write(request)

    async def wait_headers(self) -> None:
        assert self._headers_future is not None
        await self._headers_future

    async def wait_done(self) -> None:
        assert self._done_future is not None
        await self._done_future

    async def next_chunk(self) -> bytes | None:
        """The next body chunk, None at the end (raises the exchange's error)."""
        while not self.chunks:
            if self.complete:
                return None
            if self.error is not None:
                raise self.error
            self._waiter = self._loop.create_future()
            await self._waiter
        chunk = self.chunks.popleft()
        self.buffered -= len(chunk)
        if self._paused and self.buffered <= _STREAM_HIGH_WATER // 2 and self.transport is not None:
            self._paused = False
            self._last_data = self._loop.time()
            self.transport.resume_reading()
        return chunk

    def finish(self) -> bool:
        """End the exchange; True when the connection can carry another one."""
        self._busy = False
        self._stop_timer()
        reusable = self.complete and self.keep_alive and not self.closed and not self._paused
        if not reusable:
            self.close()
        return reusable

    def close(self) -> None:
        self.closed = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def _fail(self, error: HTTPError) -> None:
        if self.error is not None or self.complete:
            return
        self.error = error
        self._stop_timer()
        for future in (self._headers_future, self._done_future):
            if future is not None and not future.done():
                future.set_exception(error)
                future.exception()  # retrieved here: the waiter may be the other future
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _check_timeout(self) -> None:
        self._timer = None
        if not self._busy or self.complete:
            return
        if self._paused:  # the consumer is slow, the upstream is not silent
            self._last_data = self._loop.time()
        due = self._last_data + self._timeout
        if self._loop.time() >= due:
            self._fail(ReadTimeout(f"upstream sent nothing for {self._timeout} s"))
            self.close()
        else:
            self._timer = self._loop.call_at(due, self._check_timeout)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class _Response:
    """An answer read from a :class:`_Connection`; returns the connection to the pool when finished."""

    __slots__ = ("status_code", "headers", "_connection", "_client", "_key", "_content")

    def __init__(self, client: UpstreamClient, key: tuple[str, str, int], connection: _Connection) -> None:
        self.status_code = connection.status
        self.headers = connection.headers
        self._connection: _Connection | None = connection
        self._client = client
        self._key = key
        self._content: bytes | None = None

    def header(self, name: str) -> str | None:
        wanted = name.encode()
        for key, value in self.headers:
            if key == wanted:
                return value.decode("latin-1")
        return None

    async def aread(self) -> bytes:
        if self._content is None:
            connection = self._connection
            assert connection is not None, "response already closed"
            try:  # chunk by chunk: a streaming exchange only reads on while its chunks are taken
                parts = []
                while (chunk := await connection.next_chunk()) is not None:
                    parts.append(chunk)
                self._content = b"".join(parts)
            finally:
                self._release()
        return self._content

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        if self._content is not None:
            yield self._content
            return
        connection = self._connection
        assert connection is not None, "response already closed"
        while (chunk := await connection.next_chunk()) is not None:
            yield chunk
        self._release()

    async def aclose(self) -> None:
        self._release()

    def _release(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None and connection.finish():
            self._client._put_idle(self._key, connection)


class UpstreamClient:
    """Keep-alive HTTP/1.1 client with a pool of idle connections per upstream (see the module docstring).

    ``timeout``: seconds the upstream may stay silent while an answer is due; ``connect_timeout``: seconds to open
    a connection; idle connections are kept up to ``max_idle`` per upstream for ``keepalive_expiry`` seconds."""

    def __init__(
        self, *, timeout: float = 600.0, connect_timeout: float = 10.0, max_idle: int = 256,
        keepalive_expiry: float = 60.0,
    ) -> None:
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.max_idle = max_idle
        self.keepalive_expiry = keepalive_expiry
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._targets: dict[str, _Target] = {}
        self._ssl: ssl.SSLContext | None = None
        self.connections_opened = 0

    async def post(self, url: str, body: bytes, headers: dict[str, str], *, stream: bool = False) -> _Response:
        target = self._targets.get(url)
        if target is None:
            if len(self._targets) > 256:
                self._targets.clear()
            target = self._targets[url] = _Target(url)
        lines = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        request = f"POST{target.head}{lines}content-length: {len(body)}\r\n\r\n".encode("latin-1") + body
        while True:
            connection = await self._acquire(target)
            connection.send(request, stream)
            try:
                await connection.wait_headers()
                if not stream:
                    await connection.wait_done()
            except RemoteProtocolError:
                stale = connection.reused and not connection._received
                connection.finish()
                if stale:  # the upstream closed a keep-alive connection as we reused it: resend on a fresh one
                    continue
                raise
            except BaseException:
                connection.finish()
                raise
            response = _Response(self, target.key, connection)
            if not stream:
                await response.aread()
            return response

    async def aclose(self) -> None:
        for connections in self._idle.values():
            for connection in connections:
                connection.close()
        self._idle.clear()

    async def _acquire(self, target: _Target) -> _Connection:
        idle = self._idle.get(target.key)
        if idle:
            now = time.monotonic()
            while idle:
                connection = idle.pop()
                if not connection.closed and now - connection.idle_since < self.keepalive_expiry:
                    connection.reused = True
                    return connection
                connection.close()
        return await self._connect(target)

    async def _connect(self, target: _Target) -> _Connection:
        loop = asyncio.get_running_loop()
        context = None
        if target.tls:
            if self._ssl is None:
                self._ssl = httpx.create_ssl_context()  # the CA bundle and SSL_CERT_* variables httpx used
            context = self._ssl
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(loop, self.timeout), target.host, target.port, ssl=context,
                                       server_hostname=target.host if context else None),
                self.connect_timeout,
            )
        except TimeoutError:
            where = f"{target.host}:{target.port}"
            raise ConnectTimeout(f"could not connect to {where} within {self.connect_timeout} s") from None
        except (OSError, ssl.SSLError) as exc:
            raise ConnectError(f"could not connect to {target.host}:{target.port}: {exc}") from None
        self.connections_opened += 1
        return connection

    def _put_idle(self, key: tuple[str, str, int], connection: _Connection) -> None:
        idle = self._idle.setdefault(key, [])
        if len(idle) >= self.max_idle:
            connection.close()
            return
        connection.idle_since = time.monotonic()
        idle.append(connection)


class _HttpxResponse:
    """An httpx response seen through :class:`UpstreamResponse`."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self.status_code = response.status_code

    def header(self, name: str) -> str | None:
        return self._response.headers.get(name)

    async def aread(self) -> bytes:
        try:
            return await self._response.aread()
        except httpx.TimeoutException as exc:
            raise ReadTimeout(str(exc) or type(exc).__name__) from None
        except httpx.TransportError as exc:
            raise RemoteProtocolError(str(exc) or type(exc).__name__) from None

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        async for chunk in self._response.aiter_raw():
            yield chunk

    async def aclose(self) -> None:
        await self._response.aclose()


class HttpxUpstreamClient:
    """The :class:`UpstreamHTTP` interface over httpx, for upstreams reached through an environment proxy."""

    def __init__(self, *, timeout: float = 600.0, connect_timeout: float = 10.0) -> None:
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            limits=httpx.Limits(max_connections=1024, max_keepalive_connections=256, keepalive_expiry=60),
        )

    async def post(self, url: str, body: bytes, headers: dict[str, str], *, stream: bool = False) -> _HttpxResponse:
        request = self._client.build_request("POST", url, content=body, headers=headers)
        try:
            response = _HttpxResponse(await self._client.send(request, stream=True))
        except httpx.ConnectTimeout as exc:
            raise ConnectTimeout(f"{type(exc).__name__}: {exc}") from None
        except (httpx.ConnectError, httpx.PoolTimeout) as exc:
            raise ConnectError(f"{type(exc).__name__}: {exc}") from None
        except httpx.TimeoutException as exc:
            raise ReadTimeout(f"{type(exc).__name__}: {exc}") from None
        except httpx.TransportError as exc:
            raise RemoteProtocolError(f"{type(exc).__name__}: {exc}") from None
        if not stream:
            try:
                await response.aread()
            finally:
                await response.aclose()
        return response

    async def aclose(self) -> None:
        await self._client.aclose()
