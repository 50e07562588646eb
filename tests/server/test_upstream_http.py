"""The proxy's upstream HTTP client against a scripted raw HTTP server on 127.0.0.1 (real sockets, no mocks)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from agentlightning.server.upstream_http import (
    ConnectError,
    ReadTimeout,
    RemoteProtocolError,
    UpstreamClient,
    env_proxy_for,
)

# A handler gets (connection number, request number on that connection, request body, writer) and writes an answer.
Handler = Callable[[int, int, bytes, asyncio.StreamWriter], Awaitable[None]]


class RawServer:
    """An HTTP/1.1 server whose answers are written byte for byte by the test; counts connections."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.bodies: list[bytes] = []
        self.server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1/chat/completions"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        request = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length"))
                body = await reader.readexactly(length)
                self.bodies.append(body)
                request += 1
                await self.handler(number, request, body, writer)
                if writer.is_closing():
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[RawServer]]]:
    servers: list[RawServer] = []

    async def start(handler: Handler) -> RawServer:
        raw = RawServer(handler)
        raw.server = await asyncio.start_server(raw._serve, "127.0.0.1", 0)
        servers.append(raw)
        return raw

    yield start
    for raw in servers:
        assert raw.server is not None
        raw.server.close()


def _answer(status: int, body: bytes, extra: str = "") -> bytes:
    reason = {200: "OK", 429: "Too Many Requests", 500: "Internal Server Error"}[status]
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"{extra}\r\n").encode() + body


async def _echo(_conn: int, _req: int, body: bytes, writer: asyncio.StreamWriter) -> None:
    writer.write(_answer(200, json.dumps({"echo": json.loads(body)}).encode()))


async def test_keep_alive_connection_reused_and_body_sent_whole(serve) -> None:
    raw = await serve(_echo)
    client = UpstreamClient(timeout=5)
    for index in range(5):
        payload = json.dumps({"n": index, "text": "x" * 70_000}).encode()
        response = await client.post(raw.url, payload, {"content-type": "application/json"})
        assert response.status_code == 200
        assert response.header("content-type") == "application/json"
        assert json.loads(await response.aread())["echo"]["n"] == index
    assert raw.connections == 1 and client.connections_opened == 1
    assert len(raw.bodies) == 5 and all(len(body) > 70_000 for body in raw.bodies)
    await client.aclose()


async def test_concurrent_requests_open_parallel_connections_then_reuse_them(serve) -> None:
    async def slow_echo(conn: int, req: int, body: bytes, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(0.02)
        await _echo(conn, req, body, writer)

    raw = await serve(slow_echo)
    client = UpstreamClient(timeout=5)
    for _ in range(3):
        answers = await asyncio.gather(*(client.post(raw.url, b'{"a": 1}', {}) for _ in range(4)))
        assert [a.status_code for a in answers] == [200] * 4
    assert raw.connections == 4
    await client.aclose()


async def test_chunked_answer_read_whole_and_streamed(serve) -> None:
    async def chunked(_conn: int, _req: int, _body: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for event in (b"data: one\n\n", b"data: two\n\n", b"data: [DONE]\n\n"):
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")

    raw = await serve(chunked)
    client = UpstreamClient(timeout=5)
    whole = await client.post(raw.url, b"{}", {})
    assert await whole.aread() == b"data: one\n\ndata: two\n\ndata: [DONE]\n\n"
    streamed = await client.post(raw.url, b"{}", {}, stream=True)
    assert streamed.header("content-type") == "text/event-stream"
    chunks = [chunk async for chunk in streamed.aiter_raw()]
    assert chunks == [b"data: one\n\n", b"data: two\n\n", b"data: [DONE]\n\n"]  # passed on as they arrived
    await streamed.aclose()
    assert raw.connections == 1  # both answers complete: the connection was kept
    await client.aclose()


async def test_large_answers_read_whole_and_streamed_with_back_pressure(serve) -> None:
    big = json.dumps({"logprobs": [{"token": "x", "logprob": -0.5}] * 60_000}).encode()  # ~2 MB, above the high water

    async def large(_conn: int, req: int, _body: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(_answer(500 if req == 3 else 200, big))
        await writer.drain()

    raw = await serve(large)
    client = UpstreamClient(timeout=5)
    whole = await asyncio.wait_for(client.post(raw.url, b"{}", {}), 10)
    assert await whole.aread() == big
    streamed = await asyncio.wait_for(client.post(raw.url, b"{}", {}, stream=True), 10)
    received = b""
    async for chunk in streamed.aiter_raw():
        received += chunk
        await asyncio.sleep(0)  # a consumer slower than the socket
    assert received == big
    await streamed.aclose()
    failed = await asyncio.wait_for(client.post(raw.url, b"{}", {}, stream=True), 10)  # an error read whole
    assert failed.status_code == 500 and await asyncio.wait_for(failed.aread(), 10) == big
    assert raw.connections == 1
    await client.aclose()


async def test_answer_delimited_by_connection_close(serve) -> None:
    async def until_close(_conn: int, _req: int, _body: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n{\"done\": true}")
        await writer.drain()
        writer.close()

    raw = await serve(until_close)
    client = UpstreamClient(timeout=5)
    for _ in range(2):
        response = await client.post(raw.url, b"{}", {})
        assert json.loads(await response.aread()) == {"done": True}
    assert raw.connections == 2  # not reused after connection: close
    await client.aclose()


async def test_keep_alive_connection_closed_by_upstream_is_resent_on_a_fresh_one(serve) -> None:
    async def drop_second(conn: int, req: int, body: bytes, writer: asyncio.StreamWriter) -> None:
        if req == 2:  # the upstream dropped the idle connection just as the client reused it
            writer.close()
            return
        await _echo(conn, req, body, writer)

    raw = await serve(drop_second)
    client = UpstreamClient(timeout=5)
    assert (await client.post(raw.url, b'{"n": 1}', {})).status_code == 200
    response = await client.post(raw.url, b'{"n": 2}', {})
    assert json.loads(await response.aread()) == {"echo": {"n": 2}}
    assert raw.connections == 2
    await client.aclose()


async def test_reset_on_a_fresh_connection_raises_remote_protocol_error(serve) -> None:
    async def reset(_conn: int, _req: int, _body: bytes, writer: asyncio.StreamWriter) -> None:
        writer.close()

    raw = await serve(reset)
    client = UpstreamClient(timeout=5)
    with pytest.raises(RemoteProtocolError, match="without answering"):
        await client.post(raw.url, b"{}", {})
    assert raw.connections == 1  # a fresh connection is not resent silently: the caller decides

    async def half(_conn: int, _req: int, _body: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{\"partial")
        await writer.drain()
        writer.close()

    raw.handler = half
    with pytest.raises(RemoteProtocolError, match="middle of the answer"):
        await client.post(raw.url, b"{}", {})
    await client.aclose()


async def test_error_statuses_are_answers_with_their_body_and_headers(serve) -> None:
    async def errors(_conn: int, req: int, _body: bytes, writer: asyncio.StreamWriter) -> None:
        if req == 1:
            writer.write(_answer(500, b'{"error": {"message": "model exploded"}}'))
        else:
            writer.write(_answer(429, b'{"error": {"message": "slow down"}}', "retry-after: 0.5\r\n"))

    raw = await serve(errors)
    client = UpstreamClient(timeout=5)
    first = await client.post(raw.url, b"{}", {})
    assert first.status_code == 500 and b"model exploded" in await first.aread()
    second = await client.post(raw.url, b"{}", {}, stream=True)
    assert second.status_code == 429 and second.header("retry-after") == "0.5"
    assert b"slow down" in await second.aread()
    assert raw.connections == 1
    await client.aclose()


async def test_malformed_answer_and_silence_and_refusal(serve) -> None:
    async def garbage(_conn: int, _req: int, _body: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"SMTP ready\r\n\r\n")

    raw = await serve(garbage)
    client = UpstreamClient(timeout=0.3)
    with pytest.raises(RemoteProtocolError, match="malformed"):
        await client.post(raw.url, b"{}", {})

    async def silent(_conn: int, _req: int, _body: bytes, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(5)

    raw.handler = silent
    with pytest.raises(ReadTimeout, match="0.3 s"):
        await client.post(raw.url, b"{}", {})

    assert raw.server is not None
    port = raw.server.sockets[0].getsockname()[1]
    raw.server.close()
    await raw.server.wait_closed()
    with pytest.raises(ConnectError, match=f"127.0.0.1:{port}"):
        await client.post(f"http://127.0.0.1:{port}/v1/completions", b"{}", {})
    await client.aclose()


def test_environment_proxy_detection(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY",
                 "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert env_proxy_for("http://llm.internal:8000/v1") is None
    monkeypatch.setenv("HTTPS_PROXY", "http://corp-proxy:3128")
    assert env_proxy_for("https://api.example.com/v1") == "http://corp-proxy:3128"
    assert env_proxy_for("http://llm.internal:8000/v1") is None
    monkeypatch.setenv("NO_PROXY", "api.example.com")
    assert env_proxy_for("https://api.example.com/v1") is None
