"""Reliability: killed workers, killed clients, killed and restarted servers, hanging and crashing agents.
Every test asserts that no rollout is lost."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import server_agents
from polling import wait_for

from agentlightning.client import start_workers
from agentlightning.client._pool import WorkerPool
from agentlightning.server import LightningServer, Settings
from agentlightning.testing import MockLLMServer, MockReply

HERE = Path(__file__).parent
FAST = Settings(lease_seconds=1.0, rollout_timeout=20.0, max_attempts=3, retry_backoff=0.01, requeue_delay=0.2)


@pytest.fixture(scope="module")
def upstream() -> Iterator[MockLLMServer]:
    with MockLLMServer() as mock:
        yield mock


@pytest.fixture(scope="module")
def pool_server(
    tmp_path_factory: pytest.TempPathFactory, upstream: MockLLMServer
) -> Iterator[tuple[LightningServer, WorkerPool]]:
    """One server and one pool of 2 workers running ``behaving_agent``, shared by the tests below."""
    tmp = tmp_path_factory.mktemp("pool")
    with LightningServer(
        tmp / "s.db", upstream_url=upstream.base_url, model_name="mock-model", settings=FAST
    ) as server:
        pool = start_workers(
            server_agents.behaving_agent, server.url, nworkers=2, spool_dir=str(tmp / "spool"), kill_grace=2.0
        )
        yield server, pool
        server.request_stop()
        assert pool.wait(20), "workers did not exit when the server said stop"


def test_hanging_agent_times_out_keeping_its_calls_and_worker_is_replaced(pool_server) -> None:  # noqa: ANN001
    server, pool = pool_server
    pids = set(pool.pids)
    [hung] = server.enqueue([{"mode": "hang", "question": "hang-q"}], timeout=2.5, max_attempts=1)
    after = server.enqueue([{"mode": "ok", "question": f"after-{i}"} for i in range(3)])
    [rollout] = server.wait([hung], timeout=30)
    assert rollout.status == "timeout" and rollout.error.type == "Timeout"
    [call] = rollout.llm_calls  # the call made before the hang is kept, with server token ids
    assert call.token_source == "server" and call.output["content"] == "echo: hang-q"
    assert any("hanging now" in line for line in rollout.logs)
    assert [r.status for r in server.wait(after, timeout=30)] == ["succeeded"] * 3
    wait_for(lambda: len(pool.pids) == 2 and set(pool.pids) != pids, 20, "a replacement worker")


def test_crashing_agent_reported_with_traceback_and_logs_then_retried(pool_server) -> None:  # noqa: ANN001
    server, _ = pool_server
    [crash] = server.enqueue([{"mode": "crash", "question": "crash-q"}], max_attempts=2)
    [rollout] = server.wait([crash], timeout=30)
    assert rollout.status == "failed" and rollout.attempt == 2
    assert rollout.error.type == "ValueError" and "agent bug on crash-q" in rollout.error.traceback
    [call] = rollout.llm_calls
    assert call.token_source == "server"
    attempts = server.store.attempts(crash)
    assert [a.status for a in attempts] == ["failed", "failed"]
    for attempt in attempts:
        assert attempt.error.type == "ValueError"
        assert any("about to fail on crash-q" in line for line in attempt.logs)
        assert any("printed by the agent before crashing" in line for line in attempt.logs)


def test_worker_killed_mid_rollout_is_reassigned(pool_server, tmp_path: Path) -> None:  # noqa: ANN001
    server, pool = pool_server
    [held] = server.enqueue([{"mode": "hold", "question": "held", "mark_dir": str(tmp_path)}])
    others = server.enqueue([{"mode": "ok", "question": f"other-{i}"} for i in range(4)])
    mark = wait_for(lambda: list(tmp_path.glob("held.*")), 30, "the agent to start")[0]
    pid = int(mark.read_text())
    assert pid in pool.pids
    (tmp_path / "release-held").write_text("")  # the next attempt may finish
    os.kill(pid, signal.SIGKILL)
    [rollout] = server.wait([held], timeout=30)
    assert rollout.status == "succeeded" and rollout.attempt == 2
    first = server.store.attempts(held)[0]
    assert first.status == "failed" and first.error.type == "WorkerDied" and "signal 9" in first.error.message
    assert all(r.status == "succeeded" for r in server.wait(others, timeout=30))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _agl(*args: str, **kwargs) -> subprocess.Popen:  # noqa: ANN003
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen(
        [sys.executable, "-m", "agentlightning._cli", *args],
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        **kwargs,
    )


@pytest.mark.slow
def test_client_killed_lease_expires_and_rollout_is_reassigned(tmp_path: Path, upstream: MockLLMServer) -> None:
    dataset = tmp_path / "train.jsonl"
    dataset.write_text(json.dumps({"id": "k1", "mode": "hold", "question": "k1", "mark_dir": str(tmp_path)}) + "\n")
    with LightningServer(
        tmp_path / "s.db", upstream_url=upstream.base_url, model_name="mock-model", settings=FAST
    ) as server:
        client = _agl(
            "client",
            "--agent",
            "server_agents:behaving_agent",
            "--dataset",
            str(dataset),
            "--nworkers",
            "1",
            "--server-url",
            server.url,
            "--log-level",
            "WARNING",
        )
        try:
            dataset_id = None
            while dataset_id is None and client.poll() is None:
                dataset_id = server.wait_for_dataset(timeout=0.2)
            assert dataset_id is not None, client.stdout.read().decode()
            [rid] = server.enqueue(dataset_id)
            wait_for(lambda: list(tmp_path.glob("k1.*")), 30, "the agent to start in the client")
            os.killpg(client.pid, signal.SIGKILL)  # the whole client: supervisor and worker
            client.wait(10)
        finally:
            if client.poll() is None:
                os.killpg(client.pid, signal.SIGKILL)
        (tmp_path / "release-k1").write_text("")
        first = wait_for(
            lambda: [a for a in server.store.attempts(rid) if a.status == "lease_expired"], 10, "the lease to expire"
        )[0]
        assert first.error.type == "LeaseExpired"
        pool = start_workers(server_agents.behaving_agent, server.url, nworkers=1, spool_dir=str(tmp_path / "spool"))
        try:
            [rollout] = server.wait([rid], timeout=30)
        finally:
            server.request_stop()
            pool.wait(20)
    assert rollout.status == "succeeded" and rollout.attempt == 2


@pytest.mark.slow
def test_ctrl_c_drains_running_rollouts_and_takes_no_new_ones(tmp_path: Path, upstream: MockLLMServer) -> None:
    tasks = [{"id": f"c{i}", "mode": "hold", "question": f"c{i}", "mark_dir": str(tmp_path)} for i in range(2)]
    with LightningServer(
        tmp_path / "s.db", upstream_url=upstream.base_url, model_name="mock-model", settings=FAST
    ) as server:
        dataset_id = server.add_dataset(tasks)
        running, waiting = server.enqueue(dataset_id)
        client = _agl(
            "client",
            "--agent",
            "server_agents:behaving_agent",
            "--dataset-id",
            dataset_id,
            "--nworkers",
            "1",
            "--server-url",
            server.url,
            "--log-level",
            "WARNING",
        )
        try:
            wait_for(lambda: list(tmp_path.glob("c0.*")), 30, "the first rollout to start")
            os.killpg(client.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
            time.sleep(0.3)
            (tmp_path / "release-c0").write_text("")
            assert client.wait(30) == 0, client.stdout.read().decode()
        finally:
            if client.poll() is None:
                os.killpg(client.pid, signal.SIGKILL)
        [finished] = server.wait([running], timeout=10)
        assert finished.status == "succeeded" and finished.attempt == 1
        assert server.store.rollout_state(waiting) == ("queued", 1)


@pytest.mark.slow
def test_server_killed_and_restarted_mid_run_loses_nothing(tmp_path: Path) -> None:
    port = _free_port()
    store = tmp_path / "server.db"
    url = f"http://127.0.0.1:{port}"
    with MockLLMServer(
        handler=lambda request: MockReply(content=f"echo: {request.last_user_text}", latency=0.01)
    ) as mock:
        args = [
            "server",
            "--port",
            str(port),
            "--store",
            str(store),
            "--upstream",
            mock.base_url,
            "--model-name",
            "mock-model",
            "--lease",
            "3",
            "--max-attempts",
            "5",
            "--log-level",
            "WARNING",
        ]
        server = _agl(*args)
        http = httpx.Client(base_url=url, timeout=10)
        try:
            wait_for(lambda: _healthy(http), 30, "the server to start")
            tasks = [{"id": f"r{i}", "question": f"q{i}", "calls": 2} for i in range(16)]
            ids = http.post("/rollouts", json={"tasks": tasks}).json()["rollout_ids"]
            pool = start_workers(server_agents.chat_agent, url, nworkers=2, spool_dir=str(tmp_path / "spool"))
            try:
                done_before = wait_for(lambda: _finished(http, 3), 60, "some rollouts to finish")
                os.killpg(server.pid, signal.SIGKILL)
                server.wait(10)
                server = _agl(*args)  # same store, same port: clients reconnect
                wait_for(lambda: _healthy(http), 30, "the server to restart")
                wait_for(lambda: _finished(http, len(ids)), 90, "every rollout to finish after the restart")
                http.post("/stop")
                assert pool.wait(30)
            finally:
                pool.kill()
            rows = {row["rollout_id"]: row for row in http.get("/rollouts", params={"limit": 1000}).json()}
            assert set(rows) == set(ids)
            assert {row["status"] for row in rows.values()} == {"succeeded"}
            for before in done_before:  # everything finished before the kill is still there, unchanged
                after = http.get(f"/rollouts/{before['rollout_id']}").json()
                assert after["status"] == before["status"] and after["final_reward"] == before["final_reward"]
                assert len(after["calls"]) == before["n_calls"] == 2
                assert all(call["token_source"] == "server" for call in after["calls"])
        finally:
            if server.poll() is None:
                os.killpg(server.pid, signal.SIGTERM)
                server.wait(10)


def _healthy(http: httpx.Client) -> bool:
    try:
        return http.get("/health").status_code == 200
    except httpx.TransportError:
        return False


def _finished(http: httpx.Client, at_least: int) -> list[dict] | None:
    try:
        rows = http.get("/rollouts", params={"status": "succeeded", "limit": 1000}).json()
    except httpx.TransportError:
        return None
    return rows if len(rows) >= at_least else None


def test_proxy_call_landing_after_the_timeout_result_is_joined_as_late(tmp_path: Path) -> None:
    """A call in flight when its rollout timed out lands after the timeout result was stored (the worker reported
    and exited meanwhile): it joins the stored rollout's calls, marked late, instead of staying an orphan record."""

    def reply(request):  # noqa: ANN001, ANN202
        text = request.last_user_text
        return MockReply(content=f"echo: {text}", latency=3.0 if text.startswith("slow") else 0.0)

    with (
        MockLLMServer(handler=reply) as mock,
        LightningServer(
            tmp_path / "s.db", upstream_url=mock.base_url, model_name="mock-model", settings=FAST
        ) as server,
    ):
        pool = start_workers(
            server_agents.behaving_agent, server.url, nworkers=1, spool_dir=str(tmp_path / "spool"), kill_grace=2.0
        )
        try:
            [rid] = server.enqueue([{"mode": "late", "question": "late-q"}], timeout=1.0, max_attempts=1)
            [timed_out] = server.wait([rid], timeout=30)
            assert timed_out.status == "timeout"
            rollout = wait_for(
                lambda: (r := server.store.get_rollout(rid)) is not None and len(r.llm_calls) == 2 and r,
                15,
                "the late call to join the stored rollout",
            )
        finally:
            server.request_stop()
            pool.wait(20)
        first, late = rollout.llm_calls
        assert rollout.status == "timeout" and rollout.error.type == "Timeout"
        assert first.output["content"] == "echo: late-q" and not first.metadata.get("late")
        assert late.metadata["late"] is True and late.output["content"] == "echo: slow late-q"
        assert late.token_source == "server" and late.completion_token_ids == mock.tokenizer.encode("echo: slow late-q")
        assert [c.sequence for c in rollout.calls] == list(range(len(rollout.calls)))
        [row] = server.store.list_rollouts(status="timeout")
        assert row.n_calls == len(rollout.calls)
