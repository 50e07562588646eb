"""Agents that kill their worker process (os._exit, a segfault) or wedge it (a hang holding the GIL), run by a real
``agl client --nworkers 2`` process. Issue 21, defects 1, 11 and 12."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import fault_agents
import pytest
from _harness import AglServer, agl, fault_client, group_survivors
from polling import wait_for

from agentlightning.client import start_workers
from agentlightning.server import LightningServer, Settings
from agentlightning.testing import MockLLMServer


def test_crashing_tasks_at_the_head_of_the_queue_do_not_stop_the_client(tmp_path: Path) -> None:
    """Crashes are crashed rollouts, retried after a delay while the healthy tasks run; the client keeps serving."""
    crashing = [{"id": "exit-1", "mode": "exit"}, {"id": "segv", "mode": "segfault"}, {"id": "exit-2", "mode": "exit"}]
    healthy = [{"id": f"ok-{i}", "calls": 2} for i in range(12)]
    settings = Settings(lease_seconds=10.0, max_attempts=2, requeue_delay=1.5)
    with (
        MockLLMServer() as mock,
        LightningServer(
            tmp_path / "s.db", upstream_url=mock.base_url, model_name="mock-model", settings=settings
        ) as server,
    ):
        with fault_client(crashing + healthy, tmp_path, server, nworkers=2) as (client, dataset_id):
            ids = server.enqueue(dataset_id)
            rollouts = server.wait(ids, timeout=120)
            assert client.poll() is None, "the client stopped: " + client.stdout.read().decode()[-3000:]
            server.request_stop()
            assert client.wait(30) == 0
        by_task = {r.task_id: r for r in rollouts}
        assert all(by_task[t["id"]].status == "succeeded" and by_task[t["id"]].attempt == 1 for t in healthy)
        for task in crashing:
            rollout = by_task[task["id"]]
            assert rollout.status == "failed" and rollout.attempt == 2 and rollout.error.type == "WorkerDied"
            first, second = server.store.attempts(rollout.rollout_id)
            logs = "\n".join(first.logs)  # the agent's own lines, kept with the attempt that died
            assert f"agent line before {task['mode']} on {task['id']}" in logs
            if task["mode"] == "exit":
                assert "exited with code 1" in first.error.message and "printed before exit" in logs
            else:
                assert "signal 11" in first.error.message and "Segmentation fault" in logs
            assert second.started >= first.ended + 1.0  # re-leased after the delay, not straight away
        first_retry = min(server.store.attempts(by_task[t["id"]].rollout_id)[1].started for t in crashing)
        healthy_starts = [r.timings["start"] for r in rollouts if r.task_id.startswith("ok-")]
        assert sum(start < first_retry for start in healthy_starts) >= 2  # healthy tasks ran while crashes waited


def test_a_hang_holding_the_gil_ends_as_timeout_with_its_logs_and_frees_the_slot(tmp_path: Path) -> None:
    settings = Settings(lease_seconds=8.0, max_attempts=1, rollout_timeout=600.0)
    with (
        MockLLMServer() as mock,
        LightningServer(
            tmp_path / "s.db", upstream_url=mock.base_url, model_name="mock-model", settings=settings
        ) as server,
    ):
        pool = start_workers(fault_agents.fault_agent, server.url, nworkers=1, spool_dir=str(tmp_path / "spool"))
        try:
            [stuck] = server.enqueue([{"id": "gil", "mode": "gil", "question": "gil"}])
            after = server.enqueue([{"id": "next", "question": "next"}])
            [rollout] = server.wait([stuck], timeout=60)
            [following] = server.wait(after, timeout=60)
            [attempt] = server.store.attempts(stuck)
        finally:
            server.request_stop()
            pool.wait(20)
            pool.stop()
    assert rollout.status == "timeout" and rollout.error.type == "Timeout", rollout.error
    assert "was silent for" in rollout.error.message and "GIL" in rollout.error.message
    # killed before its lease expired (not failed/LeaseExpired), timed from the attempt's start, not the worker's spawn
    assert attempt.ended - attempt.started < settings.lease_seconds
    assert any("agent line before gil on gil" in line for line in attempt.logs)
    assert following.status == "succeeded"


def test_an_agent_that_logs_a_lone_surrogate_keeps_its_worker_and_its_result(tmp_path: Path) -> None:
    """Issue 36, defect 1: such a log line crashed the worker at upload (WorkerDied, the result never spooled)."""
    tasks = [{"id": f"sur-{i}", "mode": "surrogate"} for i in range(3)] + [{"id": "ok-0"}]
    with (
        MockLLMServer() as mock,
        LightningServer(tmp_path / "s.db", upstream_url=mock.base_url, model_name="mock-model") as server,
    ):
        with fault_client(tasks, tmp_path, server, nworkers=1) as (client, dataset_id):
            rollouts = server.wait(server.enqueue(dataset_id), timeout=60)
            server.request_stop()
            assert client.wait(30) == 0
        assert [(r.status, r.attempt, r.final_reward) for r in rollouts] == [("succeeded", 1, 1.0)] * 4
        for rollout in rollouts[:3]:
            [attempt] = server.store.attempts(rollout.rollout_id)
            assert f"agent line with a lone surrogate \ufffd on {rollout.task_id}" in "\n".join(attempt.logs)
        assert not list(tmp_path.glob("**/*.json"))  # uploaded, nothing left spooled


@pytest.mark.parametrize("to_group", [False, True], ids=["kill-pid", "kill-group"])
def test_sigterm_to_agl_client_drains_like_ctrl_c(tmp_path: Path, to_group: bool) -> None:
    """Issue 36, defect 5: SIGTERM to the PID orphaned the workers, which kept leasing, and to the group dropped the
    running rollouts; now they finish and are uploaded, nothing new is leased, and the client exits 0."""
    release = tmp_path / "release"
    tasks = [{"id": f"t-{i}", "mode": "hold", "release": str(release)} for i in range(6)]
    with (
        MockLLMServer() as mock,
        LightningServer(tmp_path / "s.db", upstream_url=mock.base_url, model_name="mock-model") as server,
    ):
        with fault_client(tasks, tmp_path, server, nworkers=2) as (client, dataset_id):
            ids = server.enqueue(dataset_id)
            wait_for(lambda: server.store.counts().get("running") == 2, 60, "both workers to lease a rollout")
            if to_group:  # as a process manager stopping a service does
                os.killpg(client.pid, signal.SIGTERM)
            else:  # as `kill PID` does
                client.send_signal(signal.SIGTERM)
            time.sleep(1.0)
            assert client.poll() is None  # draining: waiting for the two running rollouts
            release.touch()
            assert client.wait(60) == 0, client.stdout.read().decode()[-3000:]
        counts = server.store.counts()
        assert counts == {"succeeded": 2, "queued": 4}, counts
        finished = [server.store.get_rollout(rid) for rid in ids if server.store.rollout_state(rid)[0] == "succeeded"]
        assert [(r.attempt, r.final_reward) for r in finished] == [(1, 1.0), (1, 1.0)]
        # multiprocessing's resource tracker may still be exiting for a moment after the client; a worker never ends
        wait_for(lambda: not group_survivors(client.pid), 10, "the client's process group to be gone")


def test_a_client_whose_server_is_gone_says_so_and_exits_within_seconds(tmp_path: Path) -> None:
    """Issue 35, item 8: ``agl server`` is killed (nothing on its port any more); ``agl client --nworkers 2`` used to
    retry for 10 minutes. It now warns at the first refused connection, waits ``--reconnect-seconds`` (10 s) for a
    restart, and exits 2 naming the server, its workers with it."""
    dataset = tmp_path / "train.jsonl"
    dataset.write_text(json.dumps({"id": "t0", "question": "t0"}) + "\n")
    with MockLLMServer() as mock, AglServer(tmp_path / "s.db", mock.base_url) as server:
        client = agl(
            "client",
            "--agent",
            "fault_agents:fault_agent",
            "--dataset",
            str(dataset),
            "--nworkers",
            "2",
            "--server-url",
            server.url,
        )
        try:
            wait_for(lambda: server.http.get("/datasets").json() or client.poll() is not None, 60, "the dataset")
            assert client.poll() is None, client.stdout.read().decode()
            time.sleep(2.0)  # its workers are asking for work
            server.kill()
            gone = time.monotonic()
            code = client.wait(30)
            waited = time.monotonic() - gone
            output = client.stdout.read().decode()
        finally:
            if client.poll() is None:
                os.killpg(client.pid, signal.SIGKILL)
    assert code == 2, output[-3000:]
    assert waited < 20, f"the client took {waited:.0f} s to give up"  # 10 s for a restart, then out
    assert f"server {server.url} not answering (ConnectError" in output and "retrying for up to 10 s" in output
    assert (
        f"agl client: error: Client.train stopped: the server at {server.url} is gone: unreachable for 10 s" in output
    )
    assert "Traceback" not in output
    # its workers are gone with it (multiprocessing's resource tracker may take a moment more)
    wait_for(lambda: not group_survivors(client.pid), 10, "the client's process group to be gone")


def test_workers_of_a_sigkilled_agl_client_exit_on_their_own(tmp_path: Path) -> None:
    """SIGKILL (or the OOM killer) to the client runs no clean-up: its workers see their parent gone, lease nothing
    more, give up the rollouts they hold at their next heartbeat and exit; the server re-leases those rollouts once
    their leases expire."""
    release = tmp_path / "release"
    tasks = [{"id": f"t-{i}", "mode": "hold", "release": str(release)} for i in range(4)]
    settings = Settings(lease_seconds=6.0)
    with (
        MockLLMServer() as mock,
        LightningServer(
            tmp_path / "s.db", upstream_url=mock.base_url, model_name="mock-model", settings=settings
        ) as server,
    ):
        with fault_client(tasks, tmp_path, server, nworkers=2) as (client, dataset_id):
            server.enqueue(dataset_id)
            wait_for(lambda: server.store.counts().get("running") == 2, 60, "both workers to lease a rollout")
            assert len(group_survivors(client.pid)) >= 3  # the client and its two workers at least
            client.kill()
            client.wait(10)
            wait_for(lambda: not group_survivors(client.pid), 20, "the orphaned workers to exit")
            # the two they held expire (nobody heart-beats them) and are queued again
            wait_for(
                lambda: server.store.counts() == {"queued": 4}, settings.lease_seconds + 10, "the leases to expire"
            )


def test_an_agent_whose_thread_ends_slowly_after_returning_keeps_its_worker(tmp_path: Path) -> None:
    """An agent that returned is not a stuck agent, even while its thread still finalizes thread-local objects: the
    worker carries on (it used to be replaced, exiting 75, after every such rollout)."""
    with (
        MockLLMServer() as mock,
        LightningServer(tmp_path / "s.db", upstream_url=mock.base_url, model_name="mock-model") as server,
    ):
        pool = start_workers(fault_agents.fault_agent, server.url, nworkers=1, spool_dir=str(tmp_path / "spool"))
        try:
            first = server.wait(server.enqueue([{"id": "warm", "question": "warm"}]), timeout=60)
            pids = pool.pids
            tasks = [{"id": f"slow-{i}", "question": f"slow-{i}", "mode": "thread-local"} for i in range(3)]
            rollouts = server.wait(server.enqueue(tasks), timeout=60)
            after = pool.pids
        finally:
            server.request_stop()
            pool.wait(20)
            pool.stop()
    assert {r.status for r in first + rollouts} == {"succeeded"}
    assert after == pids, f"the worker was replaced: {pids} -> {after}"
