"""Clients killed mid-upload (a worker's result, an agent's LLM request): ``agl server`` logs one line naming the
route, not an ASGI traceback, and goes on serving. Issue 36, item 11."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from _harness import AglServer
from polling import wait_for

from agentlightning.testing import MockLLMServer


def _cut_upload(port: int, path: str, announced: int, sent: bytes) -> None:
    """A POST announcing ``announced`` body bytes that sends ``sent`` and closes, as a killed client does."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        sock.sendall(f"{head}Content-Length: {announced}\r\n\r\n".encode() + sent)


def test_uploads_cut_by_a_killed_client_are_one_log_line_each(tmp_path: Path) -> None:
    with MockLLMServer() as mock, AglServer(tmp_path / "store.db", mock.base_url) as server:
        server.http.post("/rollouts", json={"tasks": [{"q": 1}]}).raise_for_status()
        lease = wait_for(
            lambda: server.http.post("/workers/w/dequeue", params={"wait": 2}).json()["lease"], 30, "a lease"
        )
        rid = lease["rollout_id"]
        cuts = [
            (f"/rollouts/{rid}/v1/chat/completions", 3_000_000, b'{"model": "m", "messages": [' + b" " * 1_000_000),
            (f"/rollouts/{rid}/result", 5_000_000, b'{"attempt": 1, "output": "' + b"a" * 2_000_000),
            (f"/rollouts/{rid}/v1/chat/completions", 100, b'{"mod'),
        ]
        for path, announced, sent in cuts:
            _cut_upload(server.port, path, announced, sent)
        time.sleep(1.0)
        answer = server.http.post(f"/rollouts/{rid}/heartbeat", json={"attempt": lease["attempt"], "worker_id": "w"})
        assert answer.json()["ok"], "the server stopped serving"
        server.stop()
        output = server.output()
    assert "Traceback" not in output and "Exception in ASGI application" not in output, output[-3000:]
    lines = [line for line in output.splitlines() if "disconnected before its request body was sent" in line]
    assert len(lines) == 2 and all(f"/rollouts/{rid}/v1/chat/completions" in line for line in lines), output[-3000:]
