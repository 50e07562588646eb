"""What the fault scenarios share: real ``agl`` processes (``agl client`` on a fault dataset), a fault-injecting
upstream and a relay in front of the server that can drop heartbeats, on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import httpx
from polling import wait_for
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from agentlightning._uvicorn import BackgroundServer
from agentlightning.server import LightningServer
from agentlightning.testing import MockLLMServer

HERE = Path(__file__).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def agl(*args: str, preexec_fn: Callable[[], None] | None = None) -> subprocess.Popen:
    """``agl ARGS`` in its own session (so a test can signal the whole process group), output to a pipe."""
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen(
        [sys.executable, "-m", "agentlightning._cli", *args],
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=preexec_fn,
    )


def group_survivors(pgid: int) -> list[str]:
    """The processes of group ``pgid`` that still run (zombies, exited but not reaped, left out)."""
    return _running(["-g", str(pgid)])


def session_survivors(sid: int) -> list[str]:
    """The processes of session ``sid`` that still run (zombies left out)."""
    return _running(["-s", str(sid)])


def _running(selection: list[str]) -> list[str]:
    found = subprocess.run(["ps", "-o", "stat=,pid=,args=", *selection], capture_output=True, text=True)
    return [line for line in found.stdout.splitlines() if not line.lstrip().startswith("Z")]


class AglServer:
    """``agl server`` on a fixed port and store file, which a test can kill -9 and restart."""

    def __init__(self, store: Path, upstream: str, *extra: str, preexec_fn: Callable[[], None] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = [
            "server",
            "--port",
            str(self.port),
            "--store",
            str(store),
            "--upstream",
            upstream,
            "--model-name",
            "mock-model",
            "--log-level",
            "WARNING",
            *extra,
        ]
        self.preexec_fn = preexec_fn
        self.http = httpx.Client(base_url=self.url, timeout=30)
        self.process: subprocess.Popen | None = None

    def start(self) -> AglServer:
        self.process = agl(*self.args, preexec_fn=self.preexec_fn)
        wait_for(self.healthy, 60, f"agl server on {self.url}")
        return self

    def healthy(self) -> bool:
        try:
            return self.http.get("/health").status_code == 200
        except httpx.TransportError:
            assert self.process is None or self.process.poll() is None, self.output()
            return False

    def kill(self) -> None:
        """SIGKILL the server process group, as an OOM killer or a crash would."""
        assert self.process is not None
        os.killpg(self.process.pid, 9)
        self.process.wait(10)

    def output(self) -> str:
        assert self.process is not None
        if self.process.poll() is None:
            return "(still running)"
        return self.process.stdout.read().decode(errors="replace") if self.process.stdout else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, 15)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()
        self.http.close()

    def __enter__(self) -> AglServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class FaultyUpstream:
    """An OpenAI-compatible upstream on a fixed loopback port that forwards to a :class:`MockLLMServer` unless told to
    fail: :meth:`refuse_for` closes the port (connection refused) for some seconds; ``status`` answers every request
    with that HTTP status (and ``retry_after`` as ``Retry-After``) until set back to None; ``cut`` answers 200 and
    closes the connection halfway through the body (recorded as status 0). ``arrivals`` keeps when each request
    arrived and how it was answered."""

    def __init__(self) -> None:
        self.backend = MockLLMServer().start()
        self.status: int | None = None
        self.retry_after: str | None = None
        self.cut = False
        self.arrivals: list[tuple[float, int]] = []
        self._lock = threading.Lock()
        self._http: BackgroundServer | None = None
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.start()

    def start(self) -> None:
        app = Starlette(routes=[Route("/v1/{path:path}", self._serve, methods=["POST"])])
        self._http = BackgroundServer(app, "127.0.0.1", self.port, name="FaultyUpstream").start()

    def refuse_for(self, seconds: float) -> threading.Thread:
        """Close the port now and listen again after ``seconds`` (in the background; join the returned thread)."""
        assert self._http is not None
        self._http.stop()

        def reopen() -> None:
            time.sleep(seconds)
            self.start()

        thread = threading.Thread(target=reopen, daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        if self._http is not None:
            self._http.stop()
        self.backend.stop()

    async def _serve(self, request: Request) -> Response:
        status = self.status
        cut = self.cut
        with self._lock:
            self.arrivals.append((time.monotonic(), 0 if cut else status or 200))
        if cut:
            return StreamingResponse(_cut_body(), 200, media_type="application/json")
        if status is not None:
            headers = {"retry-after": self.retry_after} if self.retry_after else None
            return JSONResponse(
                {"error": {"message": f"injected HTTP {status}", "type": "server_error"}}, status, headers=headers
            )
        async with httpx.AsyncClient() as client:
            answer = await client.post(
                f"{self.backend.base_url}/{request.path_params['path']}",
                content=await request.body(),
                headers={"content-type": "application/json"},
            )
        return Response(answer.content, answer.status_code, media_type=answer.headers.get("content-type"))


async def _cut_body() -> AsyncIterator[bytes]:
    yield b'{"id": "chatcmpl-cut", "object": "chat.completion", "choices": [{"index": 0, "message": '
    await asyncio.sleep(0.05)
    raise ConnectionAbortedError("injected: the connection is cut halfway through the answer")


@contextlib.contextmanager
def fault_client(
    tasks: list[dict],
    tmp_path: Path,
    server: LightningServer,
    nworkers: int,
    server_url: str | None = None,
) -> Iterator[tuple[subprocess.Popen, str]]:
    """A real ``agl client`` serving ``fault_agents:fault_agent`` on ``tasks`` (its dataset attached to ``server``,
    reached at ``server_url``, default its own URL), killed with its process group on the way out if still running."""
    dataset = tmp_path / "train.jsonl"
    dataset.write_text("".join(json.dumps({**task, "question": task["id"]}) + "\n" for task in tasks))
    client = agl(
        "client",
        "--agent",
        "fault_agents:fault_agent",
        "--dataset",
        str(dataset),
        "--nworkers",
        str(nworkers),
        "--server-url",
        server_url or server.url,
        "--log-level",
        "WARNING",
    )
    try:
        dataset_id = wait_for(
            lambda: server.wait_for_dataset(timeout=0.2) or client.poll() is not None,
            60,
            "the client to attach its dataset",
        )
        assert client.poll() is None, client.stdout.read().decode()
        yield client, dataset_id
    finally:
        if client.poll() is None:
            os.killpg(client.pid, signal.SIGKILL)


class ServerRelay:
    """An HTTP relay on loopback in front of a Lightning Server, for clients that should reach it through a faulty
    path: while ``drop_heartbeats`` is set, heartbeats are answered 503 (the worker keeps its rollout running, its
    lease expires); everything else is forwarded. ``answered`` keeps (method, path, status) of each request."""

    def __init__(self, target: str) -> None:
        self.target = target.rstrip("/")
        self.drop_heartbeats = False
        self.answered: list[tuple[str, str, int]] = []
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        app = Starlette(routes=[Route("/{path:path}", self._relay, methods=["GET", "POST"])])
        self._http = BackgroundServer(app, "127.0.0.1", self.port, name="ServerRelay").start()

    def stop(self) -> None:
        self._http.stop()

    async def _relay(self, request: Request) -> Response:
        path = request.url.path
        if self.drop_heartbeats and path.endswith("/heartbeat"):
            answer = Response(b'{"detail": "injected: heartbeat lost"}', 503, media_type="application/json")
        else:
            headers = {k: v for k, v in request.headers.items() if k in ("authorization", "content-type")}
            async with httpx.AsyncClient(timeout=120) as client:
                upstream = await client.request(
                    request.method,
                    f"{self.target}{path}",
                    params=request.query_params,
                    content=await request.body(),
                    headers=headers,
                )
            answer = Response(upstream.content, upstream.status_code, media_type=upstream.headers.get("content-type"))
        self.answered.append((request.method, path, answer.status_code))
        return answer
