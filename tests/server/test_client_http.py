"""The worker protocol's keep-alive transport against a real threaded HTTP server on 127.0.0.1."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agentlightning.client.api import ServerAPI, ServerError, Unreachable
from agentlightning.client.http import KeepAliveHTTP, TransportError


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.connections: set[tuple[str, int]] = set()
        self.seen: list[dict] = []
        self.drop_next = False  # close the connection after reading the next request, without answering

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


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
        if self.path.startswith("/missing"):
            self._answer(404, {"detail": "unknown rollout 'ro-x'"})
        elif self.path.startswith("/chunked"):  # a body in chunks, with a chunk extension and a trailer
            self.send_response(200)
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            self.wfile.write(b"7;ext=1\r\n{\"a\": 1\r\n1\r\n}\r\n0\r\nx-trailer: t\r\n\r\n")
        elif self.path.startswith("/until-close"):  # no length: the body ends when the server closes
            self.send_response(200)
            self.send_header("connection", "close")
            self.end_headers()
            self.wfile.write(b'{"b": 2}')
            self.close_connection = True
        else:
            self._answer(200, {"echo": json.loads(body) if body else None, "path": self.path})

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
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def test_requests_reuse_one_connection_and_carry_token_params_and_body(server: _Server) -> None:
    api = ServerAPI(server.url, token="s3cret")
    for index in range(5):
        answer = api.request("POST", "/workers/w1/dequeue", json={"n": index}, params={"wait": 0.5})
        assert answer == {"echo": {"n": index}, "path": "/workers/w1/dequeue?wait=0.5"}
    assert len(server.connections) == 1
    assert {entry["auth"] for entry in server.seen} == {"Bearer s3cret"}
    api.close()


def test_server_dropping_an_idle_connection_is_resent_transparently(server: _Server) -> None:
    transport = KeepAliveHTTP(server.url, {})
    assert transport.request("POST", "/a", body=b"{}", headers={}, params=None, timeout=5)[0] == 200
    server.drop_next = True
    status, data = transport.request("POST", "/b", body=b'{"x": 1}', headers={}, params=None, timeout=5)
    assert status == 200 and json.loads(data)["echo"] == {"x": 1}
    assert len(server.connections) == 2
    assert [entry["path"] for entry in server.seen] == ["/a", "/b"]  # the dropped request was not answered twice
    transport.close()


def test_chunked_and_close_delimited_answers(server: _Server) -> None:
    transport = KeepAliveHTTP(server.url, {})
    assert transport.request("POST", "/chunked", body=b"{}", headers={}, params=None, timeout=5) == (200, b'{"a": 1}')
    assert transport.request("POST", "/until-close", body=None, headers={}, params=None, timeout=5) == (200, b'{"b": 2}')
    assert transport.request("POST", "/chunked", body=b"{}", headers={}, params=None, timeout=5)[1] == b'{"a": 1}'
    assert len(server.connections) == 2  # kept after the chunked answer, replaced after the one that closed
    transport.close()


def test_errors_keep_their_meaning(server: _Server) -> None:
    api = ServerAPI(server.url)
    with pytest.raises(ServerError) as refused:
        api.request("POST", "/missing/result", json={})
    assert refused.value.status == 404 and refused.value.message == "unknown rollout 'ro-x'"
    port = server.server_address[1]
    server.shutdown()
    server.server_close()
    with pytest.raises(TransportError, match="ConnectionRefusedError"):
        KeepAliveHTTP(f"http://127.0.0.1:{port}", {}).request("POST", "/a", body=None, headers={}, params=None,
                                                             timeout=2)
    with pytest.raises(Unreachable, match="ConnectionRefusedError"):
        ServerAPI(f"http://127.0.0.1:{port}").request("POST", "/a", retry_for=0.2)


def test_bad_server_url_is_named() -> None:
    with pytest.raises(ValueError, match="ftp://host"):
        KeepAliveHTTP("ftp://host", {})
