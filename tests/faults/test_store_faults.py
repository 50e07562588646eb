"""The server is killed -9 right after an upstream answer; its disk fills up; its store file is deleted or made
read-only. Issue 21, defects 3, 5 and 6."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import fault_agents
import httpx
import pytest
from _harness import AglServer
from polling import wait_for

from agentlightning.client import start_workers
from agentlightning.server import LightningServer
from agentlightning.testing import MockLLMServer
from agentlightning.types import Rollout


@pytest.fixture(scope="module")
def mock() -> Iterator[MockLLMServer]:
    with MockLLMServer() as server:
        yield server


def _lease(server: AglServer, worker: str = "w1") -> dict:
    return wait_for(
        lambda: server.http.post(f"/workers/{worker}/dequeue", params={"wait": 2}).json()["lease"], 30, "a lease"
    )


def _chat(base_url: str, text: str, stream: bool) -> str:
    """One chat call; returns once the whole answer arrived (a stream: its ``[DONE]``)."""
    body = {"model": "m", "messages": [{"role": "user", "content": text}], "stream": stream}
    with httpx.stream("POST", f"{base_url}/chat/completions", json=body, timeout=30) as response:
        assert response.status_code == 200
        if not stream:
            return response.read().decode()
        for line in response.iter_lines():
            if line.strip() == "data: [DONE]":
                return "done"  # the moment the agent has the whole answer
    raise AssertionError("stream ended without [DONE]")


def test_kill_9_right_after_an_upstream_answer_keeps_the_call_record(tmp_path: Path, mock: MockLLMServer) -> None:
    """Each kill lands within a millisecond or two of the agent getting its answer; every call's record survives,
    and the rollout's calls carry the server's token ids."""
    server = AglServer(tmp_path / "s.db", mock.base_url).start()
    try:
        server.http.post("/rollouts", json={"tasks": [{"q": i} for i in range(3)]})
        for kill, stream in enumerate([False, True, False]):
            lease = _lease(server)
            _chat(lease["llm"]["base_url"], f"kill {kill}", stream)
            server.kill()
            server.start()
            [call] = server.http.get(f"/rollouts/{lease['rollout_id']}/proxy_calls").json()
            assert call["status"] == "ok" and call["output"]["content"] == f"echo: kill {kill}"
            result = Rollout(rollout_id=lease["rollout_id"], status="succeeded", final_reward=1.0)
            body = {"attempt": 1, "worker_id": "w1", "rollout": result.model_dump(mode="json")}
            assert server.http.post(f"/rollouts/{lease['rollout_id']}/result", json=body).json()["accepted"]
            stored = server.http.get(f"/rollouts/{lease['rollout_id']}").json()
            assert [c["token_source"] for c in stored["calls"]] == ["server"]
    finally:
        server.stop()


def _set_file_size_limit(pid: int, limit: int) -> None:
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))


def test_full_disk_refuses_work_keeps_call_records_and_results_then_recovers(
    tmp_path: Path, mock: MockLLMServer
) -> None:
    """The server's files may not grow (RLIMIT_FSIZE, what a full disk looks like to SQLite) while a rollout runs:
    new work is refused with 503, /health says why, the agent's LLM calls still get answers and their records wait in
    memory, the finished result is spooled by the worker (which is then killed -9); once the disk has room, nothing is
    missing."""
    go = tmp_path / "go"
    server = AglServer(tmp_path / "s.db", mock.base_url, "--lease", "60").start()
    try:
        pool = start_workers(
            fault_agents.fault_agent,
            server.url,
            nworkers=1,
            spool_dir=str(tmp_path / "spool"),
            upload_retry_seconds=1.0,
            spool_retry_seconds=0.5,
        )
        try:
            [rid] = server.http.post(
                "/rollouts", json={"tasks": [{"question": "full", "calls": 2, "wait_before": str(go)}]}
            ).json()["rollout_ids"]
            wait_for(lambda: server.http.get(f"/rollouts/{rid}").json()["status"] == "running", 60, "the lease")
            assert server.process is not None
            _set_file_size_limit(server.process.pid, 0)  # no file of the server may grow from now on
            enqueue = lambda: server.http.post("/rollouts", json={"tasks": [{"q": 1}]})  # noqa: E731
            refused = wait_for(lambda: (r := enqueue()).status_code == 503 and r, 10, "the server to refuse work")
            assert "cannot be written (disk I/O error)" in refused.json()["detail"] and refused.headers["retry-after"]
            health = server.http.get("/health")
            assert health.status_code == 503 and "cannot be written" in health.json()["store"]
            go.write_text("")  # the agent makes its two calls and finishes while nothing can be written
            spooled = wait_for(lambda: list((tmp_path / "spool").glob("*.json")), 60, "the result to be spooled")
            assert [p.name for p in spooled] == [f"{rid}-1.json"]  # on disk while its upload is still retried,
            os.kill(pool.pids[0], signal.SIGKILL)  # so a client killed now loses nothing
            _set_file_size_limit(server.process.pid, resource.RLIM_INFINITY)  # room again
            rollout = wait_for(
                lambda: (r := server.http.get(f"/rollouts/{rid}").json())["status"] == "succeeded" and r,
                30,
                "the spooled result to be re-sent",
            )
            assert [c["token_source"] for c in rollout["calls"]] == ["server", "server"]
            assert [c["output"]["content"] for c in rollout["calls"]] == ["echo: full #0", "echo: full #1"]
            wait_for(lambda: not list((tmp_path / "spool").glob("*.json")), 10, "the spool to empty")
            assert server.http.get("/health").status_code == 200
        finally:
            server.http.post("/stop")
            pool.wait(20)
            pool.stop()
    finally:
        if server.process is not None:
            _set_file_size_limit(server.process.pid, resource.RLIM_INFINITY)  # lets it shut down cleanly
        server.stop()


def test_deleted_store_file_is_noticed_and_work_refused(tmp_path: Path, mock: MockLLMServer) -> None:
    with LightningServer(tmp_path / "s.db", upstream_url=mock.base_url, model_name="mock-model") as server:
        http = httpx.Client(base_url=server.url)
        assert http.post("/rollouts", json={"tasks": [{"q": 1}]}).status_code == 200
        (tmp_path / "s.db").unlink()
        for refused in (
            http.post("/rollouts", json={"tasks": [{"q": 2}]}),
            http.post("/workers/w/dequeue"),
            http.post("/datasets", json={"records": [{"q": 3}]}),
        ):
            assert refused.status_code == 503 and "was deleted or replaced" in refused.json()["detail"]
        health = http.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "unhealthy"
        assert server.store.counts() == {"queued": 1}  # nothing accepted into the unlinked file


@contextlib.contextmanager
def _read_only(paths: list[Path]) -> Iterator[None]:
    """Make ``paths`` immutable (``chattr +i``: no process, root included, may write them) for the block."""
    if subprocess.run(["chattr", "+i", *map(str, paths)], capture_output=True).returncode:
        pytest.skip("needs chattr +i (root, on a file system with inode flags) to make real files read-only")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", *map(str, paths)], check=True)


def test_read_only_store_refuses_work_then_recovers(tmp_path: Path, mock: MockLLMServer) -> None:
    store = tmp_path / "store"
    with LightningServer(store / "s.db", upstream_url=mock.base_url, model_name="mock-model") as server:
        http = httpx.Client(base_url=server.url)
        with _read_only([store, *store.iterdir()]):
            refused = http.post("/rollouts", json={"tasks": [{"q": 1}]})
            assert refused.status_code == 503 and "not writable" in refused.json()["detail"]
            health = http.get("/health")
            assert health.status_code == 503 and "not writable" in health.json()["store"]
        assert http.post("/rollouts", json={"tasks": [{"q": 1}]}).status_code == 200
        assert http.get("/health").status_code == 200 and server.store.counts() == {"queued": 1}
