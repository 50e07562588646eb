"""What the fault scenarios share: real ``agl`` processes, a fault-injecting upstream on loopback, waiting."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from polling import wait_for
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agentlightning._uvicorn import BackgroundServer
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
    with that HTTP status (and ``retry_after`` as ``Retry-After``) until set back to None. ``arrivals`` keeps when
    each request arrived and how it was answered."""

    def __init__(self) -> None:
        self.backend = MockLLMServer().start()
        self.status: int | None = None
        self.retry_after: str | None = None
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
        with self._lock:
            self.arrivals.append((time.monotonic(), status or 200))
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
