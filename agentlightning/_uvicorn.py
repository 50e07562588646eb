"""An ASGI application served by uvicorn from a background thread (the Lightning Server, mock and HF model servers)."""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import threading
import time
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from agentlightning.errors import AddressInUse

logger = logging.getLogger(__name__)

REQUEST_HEAD_TIMEOUT = 10.0  # seconds a connection may take to send a whole request line and headers


class RequestHeadDeadline(H11Protocol):
    """uvicorn's h11 protocol, closing a connection that has not sent a whole request head (request line and
    headers) :data:`REQUEST_HEAD_TIMEOUT` seconds after it opened, or after the first byte of its next request.
    uvicorn itself only times out idle connections between requests (``timeout_keep_alive``): one that sends nothing,
    or a header line now and then (slowloris), would be held open for ever."""

    _head_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self._wait_for_head()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:  # part of a request head, or nothing yet
            self._wait_for_head()
        elif self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
        super().connection_lost(exc)

    def _wait_for_head(self) -> None:
        if self._head_deadline is None:
            loop = asyncio.get_running_loop()
            self._head_deadline = loop.call_later(REQUEST_HEAD_TIMEOUT, self._head_too_slow)

    def _head_too_slow(self) -> None:
        logger.debug("closing a connection that sent no whole request head in %s s", REQUEST_HEAD_TIMEOUT)
        self.transport.close()


class BackgroundServer:
    """Serve ``app`` on ``host:port`` (``port=0`` picks a free one) from a daemon thread: ``start()`` returns once
    requests are accepted. Keyword arguments go to :class:`uvicorn.Config` (defaults: warnings only, no access log, no
    lifespan, :class:`RequestHeadDeadline` as the HTTP protocol)."""

    def __init__(
        self, app: Any, host: str = "127.0.0.1", port: int = 0, *, name: str = "server", **config: Any
    ) -> None:
        self.host = host
        self.port = port
        self.name = name
        self._config = {
            "log_level": "warning",
            "access_log": False,
            "lifespan": "off",
            "http": RequestHeadDeadline,
            **config,
        }
        self._app = app
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.loop: asyncio.AbstractEventLoop | None = None  # the server's event loop while it runs

    @property
    def url(self) -> str:
        """``http://host:port``, with a connectable host when bound to every interface."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    def start(self, timeout: float = 30.0) -> BackgroundServer:
        """Bind, serve, and return once the server accepts connections (RuntimeError if it does not;
        :class:`AddressInUse` if another process holds the port)."""
        if self._thread is not None:
            return self
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # IPPROTO_TCP explicitly: asyncio only sets TCP_NODELAY on accepted sockets whose protocol says TCP.
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as exc:
            sock.close()
            if exc.errno != errno.EADDRINUSE:
                raise
            raise AddressInUse(
                f"{self.name} cannot listen on {self.host}:{self.port}: another process already uses that port; "
                "pick another port (agl: --port; 0 picks a free one) or stop that process"
            ) from None
        self.port = sock.getsockname()[1]
        server = self._server = uvicorn.Server(uvicorn.Config(self._app, **self._config))

        def run() -> None:
            try:
                with asyncio.Runner(loop_factory=server.config.get_loop_factory()) as runner:  # uvloop if installed
                    self.loop = runner.get_loop()
                    runner.run(server.serve(sockets=[sock]))
            finally:
                sock.close()

        self._thread = threading.Thread(target=run, name=f"{self.name}:{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} could not start on {self.host}:{self.port}")
            time.sleep(0.005)
        return self

    def stop(self, timeout: float = 15.0) -> None:
        """Stop serving and wait for the thread (idempotent)."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
        self._server = self._thread = self.loop = None
