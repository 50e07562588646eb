"""Connections that never send a whole request head (slowloris: nothing at all, or one header line every two
seconds) are closed after ``REQUEST_HEAD_TIMEOUT`` (10 s) by ``agl server``, while real clients, keep-alive ones
included, are served throughout. Issue 36, item 11 (0 of 200 such connections closed in 30 s)."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from _harness import AglServer

from agentlightning._uvicorn import REQUEST_HEAD_TIMEOUT
from agentlightning.testing import MockLLMServer


@pytest.fixture(scope="module")
def mock() -> Iterator[MockLLMServer]:
    with MockLLMServer() as server:
        yield server


def _closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1024) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_slowloris_connections_are_closed_and_real_clients_served(tmp_path: Path, mock: MockLLMServer) -> None:
    with AglServer(tmp_path / "store.db", mock.base_url) as server:
        silent, trickling = [], []
        for n in range(200):
            sock = socket.create_connection(("127.0.0.1", server.port))
            sock.setblocking(False)
            if n % 2:
                sock.send(b"POST /workers/w/dequeue HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                trickling.append(sock)
            else:
                silent.append(sock)
        opened = time.monotonic()
        keep_alive = httpx.Client(base_url=server.url)  # one pooled connection, idle 2 s between requests
        closed: set[int] = set()
        line = 0
        while time.monotonic() - opened < REQUEST_HEAD_TIMEOUT + 5 and len(closed) < 200:
            started = time.monotonic()
            assert keep_alive.get("/health").status_code == 200
            assert time.monotonic() - started < 2.0, "the server stalled behind the slow connections"
            for sock in trickling:
                if sock.fileno() not in closed:
                    with contextlib.suppress(BlockingIOError, OSError):
                        sock.send(b"X-Slow-%d: still here\r\n" % line)
            line += 1
            closed |= {sock.fileno() for sock in silent + trickling if _closed_by_server(sock)}
            if time.monotonic() - opened < REQUEST_HEAD_TIMEOUT - 1:
                assert not closed, "closed before the request head timeout"
            time.sleep(2.0)
        assert len(closed) == 200, f"{len(closed)} of 200 slow connections closed in {REQUEST_HEAD_TIMEOUT + 5} s"
        assert keep_alive.get("/stats").status_code == 200  # the idle keep-alive connection still serves
        keep_alive.close()
        for sock in silent + trickling:
            sock.close()
