"""A worker's result upload whose answer (with the worker's next lease) is lost because the server was killed -9
before sending it: the worker re-sends it to the restarted server and gets that same lease, not a second one, so no
rollout stays leased to nobody until its lease expires. Issue 36, item 7 (the server remembered re-sends in memory)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from _harness import AglServer
from polling import wait_for

from agentlightning.protocol import Task
from agentlightning.server.store import SQLiteStore
from agentlightning.server.store._schema import SCHEMA
from agentlightning.testing import MockLLMServer
from agentlightning.types import Rollout


@pytest.fixture(scope="module")
def mock() -> Iterator[MockLLMServer]:
    with MockLLMServer() as server:
        yield server


def _upload(server: AglServer, lease: dict, worker: str) -> dict:
    rollout = Rollout(rollout_id=lease["rollout_id"], status="succeeded", final_reward=1.0)
    body = {"attempt": lease["attempt"], "worker_id": worker, "rollout": rollout.model_dump(mode="json")}
    answer = server.http.post(f"/rollouts/{lease['rollout_id']}/result", params={"next": 1}, json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_result_resent_to_a_restarted_server_gets_the_lease_its_lost_answer_carried(
    tmp_path: Path, mock: MockLLMServer
) -> None:
    server = AglServer(tmp_path / "store.db", mock.base_url, "--lease", "60").start()
    try:
        server.http.post("/rollouts", json={"tasks": [{"q": i} for i in range(3)]}).raise_for_status()
        first = wait_for(
            lambda: server.http.post("/workers/w1/dequeue", params={"wait": 2}).json()["lease"], 30, "a lease"
        )
        lost = _upload(server, first, "w1")["next"]["lease"]  # committed, but the worker never reads this answer
        assert lost is not None

        server.kill()
        server.start()  # the same store and port

        resent = _upload(server, first, "w1")
        assert resent["duplicate"] is True
        again = resent["next"]["lease"]
        assert (again["rollout_id"], again["attempt"]) == (lost["rollout_id"], lost["attempt"])
        assert again["llm"]["base_url"].endswith(f"/rollouts/{lost['rollout_id']}/v1")
        assert server.http.get("/stats").json()["rollouts"] == {"succeeded": 1, "running": 1, "queued": 1}
        assert _upload(server, first, "w1")["next"]["lease"]["rollout_id"] == lost["rollout_id"]  # and again

        finished = _upload(server, again, "w1")  # the re-handed lease is the worker's: its result is taken
        assert finished["accepted"] is True
        third = finished["next"]["lease"]
        assert third is not None and third["rollout_id"] not in (first["rollout_id"], lost["rollout_id"])
        assert server.http.get("/stats").json()["rollouts"] == {"succeeded": 2, "running": 1}
    finally:
        server.stop()


def test_a_store_from_before_remembered_re_sends_opens_and_remembers_from_then_on(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    old = sqlite3.connect(path)
    old.executescript(SCHEMA.replace("\n    handed_rollout TEXT, handed_attempt INTEGER,", ""))
    old.execute("INSERT INTO attempts(rollout_id, attempt, worker_id, status) VALUES ('ro-old', 1, 'w', 'succeeded')")
    old.commit()
    old.close()
    store = SQLiteStore(path, requeue_delay=0.0)
    [rid, nxt] = store.enqueue([Task(task_id="a", payload={}), Task(task_id="b", payload={})])
    lease = store.dequeue("w", 10.0)
    assert lease is not None and lease.rollout_id == rid
    result = Rollout(rollout_id=rid, status="succeeded")
    _, handed = store.complete_and_dequeue(rid, 1, "w", result, 10.0)
    outcome, again = store.complete_and_dequeue(rid, 1, "w", result, 10.0)
    assert outcome.duplicate and handed is not None and again is not None
    assert again.rollout_id == handed.rollout_id == nxt
    store.close()
