"""Rollout workers as Ray actors on a real local Ray cluster (2 CPUs, one per module): the worker loop
leasing from a real Lightning Server over HTTP, the agent shipped through ``runtime_env``, a real SIGKILL of an
actor's process mid-rollout, the SQLite store checked for lost or duplicated rollouts, ``agl client --ray`` as a
process, and one ``agl.train(workers="ray")`` step on the tiny model."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import agentlightning as agl
from agentlightning.server import LightningServer, Settings, SQLiteStore
from agentlightning.testing import MockLLMServer

ray = pytest.importorskip("ray", reason="the Ray worker tests need Ray: pip install 'agentlightning-rl[ray]'")

import ray_agents  # noqa: E402 - after the skip

HERE = Path(__file__).resolve().parent
SHIP = {"working_dir": str(HERE)}  # the actors import ray_agents from the shipped copy of this folder
FAST = Settings(lease_seconds=3.0, rollout_timeout=60.0, requeue_delay=0.1)


@pytest.fixture(scope="module")
def cluster() -> Any:
    """A new local Ray cluster (this machine only), its job shipping this folder to the actors; its GCS address."""
    ray.init(address="local", num_cpus=2, include_dashboard=False, runtime_env=SHIP, logging_level=logging.WARNING)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def _wait_for(probe: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := probe():
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _held(tmp_path: Path, *names: str) -> list[dict[str, Any]]:
    return [{"id": name, "question": name, "hold": True, "mark_dir": str(tmp_path)} for name in names]


def test_a_killed_actor_is_restarted_and_its_rollout_retried_with_nothing_lost(
    cluster: str, tmp_path: Path, mock_llm_server: MockLLMServer
) -> None:
    with LightningServer(
        tmp_path / "s.db",
        upstream_url=mock_llm_server.base_url,
        model_name="mock-model",
        model_version="v1",
        settings=FAST,
    ) as server:
        [held] = server.enqueue(_held(tmp_path, "held"))
        others = server.enqueue([{"id": f"t{i}", "question": f"q{i}"} for i in range(6)], group_size=2, group_id="g")
        workers = agl.RayWorkers(num_workers=2, num_cpus_per_worker=0.5)
        workers.start(ray_agents.chat_agent, server.url, spool_dir=str(tmp_path / "spool"))
        try:
            killed = int(_wait_for(lambda: list(tmp_path.glob("held.*")), 60, "the held rollout")[0].read_text())
            (tmp_path / "release-held").write_text("")  # its next attempt may finish
            os.kill(killed, signal.SIGKILL)  # the actor's process, mid-rollout
            rollouts = server.wait([held, *others], timeout=90)
            # Ray restarted the dead actor: two held rollouts now run at once, in two processes, neither the dead one
            pair = server.enqueue(_held(tmp_path, "p0", "p1"))
            marks = _wait_for(
                lambda: len(found := [*tmp_path.glob("p0.*"), *tmp_path.glob("p1.*")]) == 2 and found,
                60,
                "both actors to run a held rollout",
            )
            pids = {int(mark.read_text()) for mark in marks}
            for name in ("p0", "p1"):
                (tmp_path / f"release-{name}").write_text("")
            rollouts += server.wait(pair, timeout=30)
        finally:
            server.request_stop()
            assert workers.wait(30), "the workers must exit when the server says stop"
            workers.stop()
        assert len(pids) == 2 and killed not in pids
        assert workers.error is None
        attempts = server.store.attempts(held)
    assert [r.status for r in rollouts] == ["succeeded"] * 15
    by_id = {r.rollout_id: r for r in rollouts}
    assert by_id[held].attempt == 2 and [a.status for a in attempts] == ["lease_expired", "succeeded"]
    assert attempts[0].error.type == "LeaseExpired"
    assert all(len(r.llm_calls) == 1 and r.llm_calls[0].token_source == "server" for r in rollouts)
    assert all(any("-ray-" in line for line in r.logs) for r in rollouts), "each names the Ray worker that ran it"
    store = SQLiteStore(tmp_path / "s.db")  # reopened from disk: every rollout once, finished
    try:
        assert sorted(info.rollout_id for info in store.list_rollouts()) == sorted(by_id)
        assert store.counts() == {"succeeded": 15}
    finally:
        store.close()


def test_a_hung_agent_times_out_and_ray_replaces_its_actor(
    cluster: str, tmp_path: Path, mock_llm_server: MockLLMServer
) -> None:
    settings = Settings(lease_seconds=3.0, rollout_timeout=60.0, requeue_delay=0.1, max_attempts=1)
    with LightningServer(
        tmp_path / "s.db", upstream_url=mock_llm_server.base_url, model_name="mock-model", settings=settings
    ) as server:
        [hung] = server.enqueue([{"id": "hung", "question": "hung", "hang": True}])
        others = server.enqueue([{"id": f"o{i}", "question": f"o{i}"} for i in range(3)])
        workers = agl.RayWorkers(num_workers=1, num_cpus_per_worker=0.5)  # one actor: it must come back to finish
        workers.start(ray_agents.chat_agent, server.url, timeout=2.0, spool_dir=str(tmp_path / "spool"))
        try:
            [timed_out] = server.wait([hung], timeout=60)
            rollouts = server.wait(others, timeout=60)
        finally:
            server.request_stop()
            assert workers.wait(30)
            workers.stop()
    assert timed_out.status == "timeout" and timed_out.error.type == "Timeout"
    assert [r.status for r in rollouts] == ["succeeded"] * 3 and workers.error is None
    [hung_pid] = {line.rsplit(" pid ", 1)[1] for line in timed_out.logs if " pid " in line}
    assert all(f" pid {hung_pid}" not in " ".join(r.logs) for r in rollouts), "a new process took over"


def test_an_agent_the_actors_cannot_import_stops_the_workers_with_the_reason(
    cluster: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mock_llm_server: MockLLMServer
) -> None:
    (tmp_path / "driver_only_agent.py").write_text("def agent(task, llm):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # importable here, not shipped to the actors
    with LightningServer(tmp_path / "s.db", upstream_url=mock_llm_server.base_url, settings=FAST) as server:
        [rid] = server.enqueue([{"question": "q"}])
        workers = agl.RayWorkers(num_workers=1, num_cpus_per_worker=0.5).start("driver_only_agent:agent", server.url)
        try:
            assert workers.wait(60)
        finally:
            workers.stop()
        assert server.store.attempts(rid) == [] and server.store.rollout_state(rid)[0] == "queued", "nothing leased"
    assert "cannot import module 'driver_only_agent'" in (workers.error or "")


def test_agl_client_ray_serves_a_dataset(cluster: str, tmp_path: Path, mock_llm_server: MockLLMServer) -> None:
    dataset = tmp_path / "train.jsonl"
    dataset.write_text("".join(json.dumps({"id": f"c{i}", "question": f"c{i}"}) + "\n" for i in range(3)))
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    with LightningServer(
        tmp_path / "s.db", upstream_url=mock_llm_server.base_url, model_name="mock-model", settings=FAST
    ) as server:
        client = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agentlightning._cli",
                "client",
                "--ray",
                cluster,
                "--agent",
                "ray_agents:chat_agent",
                "--dataset",
                str(dataset),
                "--nworkers",
                "2",
                "--cpus-per-worker",
                "0.5",
                "--server-url",
                server.url,
                "--runtime-env-json",
                json.dumps(SHIP),
                "--log-level",
                "WARNING",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            dataset_id = None
            while dataset_id is None and client.poll() is None:
                dataset_id = server.wait_for_dataset(timeout=0.2)
            assert dataset_id is not None, client.communicate()[0].decode()[-3000:]
            rollouts = server.wait(server.enqueue(dataset_id, group_size=2), timeout=90)
            server.request_stop()
            output = client.communicate(timeout=60)[0].decode()
        finally:
            if client.poll() is None:
                os.killpg(client.pid, signal.SIGKILL)
    assert client.returncode == 0, output[-3000:]
    assert [r.status for r in rollouts] == ["succeeded"] * 6
    assert all(any("-ray-" in line for line in r.logs) for r in rollouts)


def test_agl_train_with_workers_ray_makes_a_step(cluster: str, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from agentlightning.trainers.models import tiny_model

    model, tokenizer = tiny_model(seed=1)
    tasks = [{"id": f"t{i}", "question": f"What is {i} + {i}?"} for i in range(2)]
    result = agl.train(
        ray_agents.chat_agent,
        tasks,
        model=model,
        tokenizer=tokenizer,
        group_size=4,
        tasks_per_step=2,
        max_steps=1,
        learning_rate=1e-2,
        micro_batch_size=4,
        max_completion_length=8,
        output_dir=tmp_path / "run",
        nworkers=2,
        workers="ray",  # RayWorkers(num_workers=2) on the cluster this process joined
        progress=False,
        save_model=False,
        val_every=0,
    )
    [step] = result.history
    assert step["model_version"] == "v0" and step["model_version_after"] == "v1" and step["train/rows"] > 0
    store = SQLiteStore(tmp_path / "run" / "store.db")
    try:
        rollouts = [store.get_rollout(info.rollout_id) for info in store.list_rollouts()]
    finally:
        store.close()
    assert len(rollouts) == 8 and all(r.status == "succeeded" for r in rollouts)
    assert all(any("-ray-" in line for line in r.logs) for r in rollouts), "the Ray actors ran them"


def test_train_config_checks_workers() -> None:
    from agentlightning.trainers.config import TrainConfig

    with pytest.raises(ValueError, match="workers='threads'"):
        TrainConfig(workers="threads")
    with pytest.raises(ValueError, match="Ray workers need the server"):
        TrainConfig(workers="ray", use_server=False)
    assert isinstance(TrainConfig(workers=agl.RayWorkers(num_workers=2)).workers, agl.RayWorkers)
    with pytest.raises(ValueError, match="num_workers=0"):
        agl.RayWorkers(num_workers=0)
