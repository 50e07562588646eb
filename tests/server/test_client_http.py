"""The worker protocol's HTTP behaviour through ServerAPI, against real threaded HTTP servers on 127.0.0.1."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agentlightning.client import ServerAPI, ServerError
from agentlightning.protocol import Unreachable


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.connections: set[tuple[str, int]] = set()
        self.seen: list[dict] = []
        self.drop_next = False  # close the connection after reading the next request, without answering
        self.unavailable = 0  # answer this many requests with 503 first
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def close(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        self.server.connections.add(self.client_address)
        if self.server.drop_next:
            self.server.drop_next = False
            self.close_connection = True
            return
        self.server.seen.append({"path": self.path, "auth": self.headers.get("authorization"), "body": body})
        if self.server.unavailable:
            self.server.unavailable -= 1
            self._answer(503, {"detail": "restarting"})
        elif self.path.startswith("/missing"):
            self._answer(404, {"detail": "unknown rollout 'ro-x'"})
        elif self.path.startswith("/openai-error"):
            self._answer(401, {"error": {"message": "missing bearer token"}})
        elif self.path.startswith("/chunked"):  # a body in chunks, with a chunk extension and a trailer
            self.send_response(200)
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            self.wfile.write(b'7;ext=1\r\n{"a": 1\r\n1\r\n}\r\n0\r\nx-trailer: t\r\n\r\n')
        elif self.path.startswith("/until-close"):  # no length: the body ends when the server closes
            self.send_response(200)
            self.send_header("connection", "close")
            self.end_headers()
            self.wfile.write(b'{"b": 2}')
            self.close_connection = True
        else:
            self._answer(200, {"echo": json.loads(body) if body else None, "path": self.path})

    do_GET = do_POST  # noqa: N815 - http.server's naming

    def _answer(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def server() -> Iterator[_Server]:
    httpd = _Server()
    yield httpd
    httpd.close()


@pytest.fixture(autouse=True)
def _no_env_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


def test_requests_reuse_one_connection_and_carry_token_params_and_body(server: _Server) -> None:
    api = ServerAPI(server.url, token="s3cret")
    for index in range(5):
        answer = api.request("POST", "/workers/w1/dequeue", json={"n": index}, params={"wait": 0.5})
        assert answer == {"echo": {"n": index}, "path": "/workers/w1/dequeue?wait=0.5"}
    assert len(server.connections) == 1
    assert {entry["auth"] for entry in server.seen} == {"Bearer s3cret"}
    api.close()


def test_server_dropping_a_connection_is_resent_transparently(server: _Server) -> None:
    api = ServerAPI(server.url)
    assert api.request("POST", "/a", json={}) == {"echo": {}, "path": "/a"}
    server.drop_next = True
    assert api.request("POST", "/b", json={"x": 1}, retry_for=5)["echo"] == {"x": 1}
    assert len(server.connections) == 2
    assert [entry["path"] for entry in server.seen] == ["/a", "/b"]  # the dropped request was not answered twice
    api.close()


def test_chunked_and_close_delimited_answers(server: _Server) -> None:
    api = ServerAPI(server.url)
    assert api.request("POST", "/chunked", json={}) == {"a": 1}
    assert api.request("POST", "/until-close") == {"b": 2}
    assert api.request("POST", "/chunked", json={}) == {"a": 1}
    assert len(server.connections) == 2  # kept after the chunked answer, replaced after the one that closed
    api.close()


def test_unavailable_answers_are_retried_with_backoff(server: _Server) -> None:
    server.unavailable = 3
    started = time.monotonic()
    assert ServerAPI(server.url).request("POST", "/ok", json={"n": 1}, retry_for=10)["echo"] == {"n": 1}
    assert len(server.seen) == 4 and time.monotonic() - started >= 0.05  # three 503s, then the answer
    server.unavailable = 100
    with pytest.raises(Unreachable, match="HTTP 503"):
        ServerAPI(server.url).request("POST", "/ok", retry_for=0.3)


def test_errors_keep_their_meaning(server: _Server) -> None:
    api = ServerAPI(server.url)
    with pytest.raises(ServerError) as refused:
        api.request("POST", "/missing/result", json={})
    assert refused.value.status == 404 and refused.value.message == "unknown rollout 'ro-x'"
    assert len(server.seen) == 1  # a 4xx is not retried
    with pytest.raises(ServerError, match="401: missing bearer token"):
        api.request("GET", "/openai-error")
    port = server.server_address[1]
    server.close()
    started = time.monotonic()
    with pytest.raises(Unreachable, match="ConnectError"):
        ServerAPI(f"http://127.0.0.1:{port}").request("POST", "/a", retry_for=0.3)
    assert time.monotonic() - started < 3.0


def test_a_restarting_server_is_waited_for(server: _Server) -> None:
    port = server.server_address[1]
    server.close()
    restarted: list[_Server] = []
    threading.Timer(0.5, lambda: restarted.append(_Server(port))).start()  # same port, half a second later
    try:
        api = ServerAPI(f"http://127.0.0.1:{port}")
        assert api.request("POST", "/back", json={"n": 2}, retry_for=20)["echo"] == {"n": 2}
    finally:
        time.sleep(0.1)
        for httpd in restarted:
            httpd.close()


def test_stop_signal_ends_the_wait_for_an_unreachable_server(server: _Server) -> None:
    port = server.server_address[1]
    server.close()
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    started = time.monotonic()
    with pytest.raises(Unreachable):
        ServerAPI(f"http://127.0.0.1:{port}").request("POST", "/a", retry_for=None, stop=stop)  # no deadline
    assert time.monotonic() - started < 5.0


def test_environment_proxy_is_used(server: _Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", server.url)  # the stub server plays the proxy
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    api = ServerAPI("http://lightning.invalid:4747", token="t")
    answer = api.request("POST", "/workers/w/dequeue", json={"n": 3})
    assert answer == {"echo": {"n": 3}, "path": "http://lightning.invalid:4747/workers/w/dequeue"}
    assert server.seen[-1]["auth"] == "Bearer t"
    monkeypatch.setenv("NO_PROXY", "lightning.invalid")
    with pytest.raises(Unreachable):
        ServerAPI("http://lightning.invalid:4747").request("POST", "/a", retry_for=0.1)


def test_bad_server_url_is_named() -> None:
    with pytest.raises(ValueError, match="ftp://host"):
        ServerAPI("ftp://host")
