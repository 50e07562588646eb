"""The SQLite store: queue, leases, retries, idempotent results, joins, persistence across reopen."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest

from agentlightning.protocol import Task, dataset_id_for
from agentlightning.server.store import Conflict, NotFound, SQLiteStore, StoreError
from agentlightning.server.store._schema import SCHEMA
from agentlightning.types import Call, ErrorInfo, Reward, Rollout


@pytest.fixture
def store(tmp_path: Path) -> SQLiteStore:
    s = SQLiteStore(tmp_path / "store.db", requeue_delay=0.0)
    yield s
    s.close()


def _result(lease, status: str = "succeeded", reward: float | None = 1.0, calls=None) -> Rollout:
    return Rollout(
        rollout_id=lease.rollout_id,
        task_id=lease.task_id,
        task=lease.task,
        attempt=lease.attempt,
        status=status,
        calls=calls or [],
        rewards=[Reward(value=reward, source="final")] if reward is not None else [],
        final_reward=reward,
        logs=[f"log of attempt {lease.attempt}"],
        error=None if status == "succeeded" else ErrorInfo(type="ValueError", message="boom", traceback="tb"),
    )


def test_dataset_upload_is_idempotent_and_content_addressed(store: SQLiteStore) -> None:
    records = [{"id": "a", "q": 1}, {"q": 2}]
    info = store.add_dataset(records)
    assert info.dataset_id == dataset_id_for(records) and info.size == 2
    assert store.add_dataset(records).dataset_id == info.dataset_id
    tasks = store.dataset_tasks(info.dataset_id)
    assert [t.task_id for t in tasks] == ["a", f"{info.dataset_id}:1"]
    assert tasks[1].payload == {"q": 2}
    with pytest.raises(Conflict, match="different content"):
        store.add_dataset([{"q": 3}], dataset_id=info.dataset_id)
    with pytest.raises(StoreError, match="empty"):
        store.add_dataset([])
    with pytest.raises(NotFound, match="ds-nope"):
        store.dataset_tasks("ds-nope")


def test_enqueue_groups_and_dequeue_in_order(store: SQLiteStore) -> None:
    info = store.add_dataset([{"id": "t1"}, {"id": "t2"}])
    ids = store.enqueue(
        store.dataset_tasks(info.dataset_id), group_size=3, group_id="step-1", dataset_id=info.dataset_id
    )
    assert len(ids) == 6
    leases = [store.dequeue("w1", 10.0) for _ in range(6)]
    assert [lease.rollout_id for lease in leases] == ids
    assert {lease.group_id for lease in leases[:3]} == {"step-1:t1"}
    assert {lease.group_id for lease in leases[3:]} == {"step-1:t2"}
    assert store.dequeue("w1", 10.0) is None
    assert store.counts() == {"running": 6}
    with pytest.raises(StoreError, match="group_size"):
        store.enqueue(store.dataset_tasks(info.dataset_id), group_size=0)


def test_proxy_calls_written_with_the_result_survive_a_failed_result_write(
    store: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    info = store.add_dataset([{"id": "t"}, {"id": "u"}])
    first_id, other_id = store.enqueue(store.dataset_tasks(info.dataset_id))
    lease = store.dequeue("w", 10.0)
    other = store.dequeue("w", 10.0)
    store.record_proxy_call(Call(rollout_id=first_id, completion_token_ids=[1]).model_dump(mode="json"), attempt=1)
    store.record_proxy_call(Call(rollout_id=other_id, completion_token_ids=[2]).model_dump(mode="json"), attempt=1)
    # ^ still running

    def broken(*_args: object) -> None:
        raise OSError("disk full")

    with monkeypatch.context() as patch:
        patch.setattr(store, "_write_final", broken)
        with pytest.raises(OSError, match="disk full"):
            store.complete(first_id, 1, "w", _result(lease))
    assert store.rollout_state(first_id) == ("running", 1)
    assert store.complete(first_id, 1, "w", _result(lease)).accepted
    assert [c.completion_token_ids for c in store.get_rollout(first_id).calls] == [[1]]
    assert store.complete(other_id, 1, "w", _result(other)).accepted
    assert [c.completion_token_ids for c in store.get_rollout(other_id).calls] == [[2]]


def test_result_is_idempotent_and_joins_proxy_calls(store: SQLiteStore) -> None:
    info = store.add_dataset([{"id": "t"}])
    [rid] = store.enqueue(store.dataset_tasks(info.dataset_id))
    store.set_model_version("v7", "m", None)  # the rollout is on the version current when it is leased
    lease = store.dequeue("w", 10.0)
    store.set_model_version("v8", "m", None)  # a later version does not change it
    proxy = Call(
        rollout_id=rid,
        name="m",
        response_id="resp-1",
        prompt_token_ids=[1, 2],
        completion_token_ids=[3],
        token_source="server",
        metadata={"model_version": "v7"},
    )
    store.record_proxy_call(proxy.model_dump(mode="json"), attempt=1)
    client = Call(rollout_id=rid, role="writer", response_id="resp-1", input=[{"role": "user", "content": "hi"}])
    first = store.complete(rid, 1, "w", _result(lease, calls=[client]))
    again = store.complete(rid, 1, "w", _result(lease, calls=[client]))
    assert first.accepted and first.status == "succeeded"
    assert again.duplicate and not again.accepted
    rollout = store.get_rollout(rid)
    assert rollout.status == "succeeded" and rollout.final_reward == 1.0 and rollout.model_version == "v7"
    [call] = rollout.calls
    assert call.role == "writer" and call.prompt_token_ids == [1, 2] and call.completion_token_ids == [3]
    assert call.token_source == "server" and call.metadata["model_version"] == "v7"
    assert [r.value for r in rollout.rewards] == [1.0]
    assert store.rollout_state(rid) == ("succeeded", 1)


def test_proxy_call_landing_after_the_result_joins_only_the_attempt_that_finished(store: SQLiteStore) -> None:
    info = store.add_dataset([{"id": "t"}])
    [rid] = store.enqueue(store.dataset_tasks(info.dataset_id), max_attempts=2)
    first = store.dequeue("w", 10.0)
    assert store.complete(rid, 1, "w", _result(first, status="timeout")).retried
    stale = Call(rollout_id=rid, response_id="resp-old", completion_token_ids=[1])
    store.record_proxy_call(stale.model_dump(mode="json"), attempt=1)  # attempt 1 no longer counts
    second = store.dequeue("w", 10.0)
    client = Call(rollout_id=rid, role="writer", response_id="resp-late", input="hi")
    assert store.complete(rid, 2, "w", _result(second, status="timeout", calls=[client])).status == "timeout"
    late = Call(rollout_id=rid, response_id="resp-late", completion_token_ids=[7], token_source="server")
    store.record_proxy_call(late.model_dump(mode="json"), attempt=2)
    [call] = store.get_rollout(rid).calls
    assert call.role == "writer" and call.completion_token_ids == [7] and call.token_source == "server"
    assert call.metadata["late"] is True and call.metadata["proxy_call_id"] == late.call_id
    assert [c.response_id for c in store.proxy_calls(rid)] == ["resp-old", "resp-late"]


def test_complete_and_dequeue_stores_the_result_and_leases_the_next_rollout(store: SQLiteStore) -> None:
    info = store.add_dataset([{"id": "a"}, {"id": "b"}, {"id": "c"}])
    first_id, second_id, third_id = store.enqueue(store.dataset_tasks(info.dataset_id), max_attempts=2)
    first = store.dequeue("w", 10.0)
    store.record_proxy_call(Call(rollout_id=first_id, completion_token_ids=[4]).model_dump(mode="json"), attempt=1)
    outcome, lease = store.complete_and_dequeue(first_id, 1, "w", _result(first), 10.0)
    assert outcome.accepted and lease is not None and lease.rollout_id == second_id
    assert [c.completion_token_ids for c in store.get_rollout(first_id).calls] == [[4]]
    assert store.rollout_state(second_id) == ("running", 1) and store.workers()[0]["leased"] == 2
    again, same = store.complete_and_dequeue(first_id, 1, "w", _result(first), 10.0)  # a re-send: the same lease
    assert again.duplicate and same is not None and (same.rollout_id, same.attempt) == (second_id, 1)
    assert store.workers()[0]["leased"] == 2
    failed, other = store.complete_and_dequeue(second_id, 1, "w", _result(lease, status="failed"), 10.0)
    assert failed.retried and other is not None and other.rollout_id == third_id
    _, retry = store.complete_and_dequeue(third_id, 1, "w", _result(other), 10.0)
    assert retry is not None and (retry.rollout_id, retry.attempt) == (second_id, 2)
    assert store.complete_and_dequeue(second_id, 2, "w", _result(retry), 10.0)[1] is None  # queue empty


def test_failures_retry_with_bounded_attempts_keeping_errors_and_logs(store: SQLiteStore) -> None:
    info = store.add_dataset([{"id": "t"}])
    [rid] = store.enqueue(store.dataset_tasks(info.dataset_id), max_attempts=2)
    lease = store.dequeue("w", 10.0)
    outcome = store.complete(rid, 1, "w", _result(lease, status="failed", reward=None))
    assert outcome.retried and outcome.status == "queued" and outcome.attempt == 2
    lease2 = store.dequeue("w", 10.0)
    assert lease2.rollout_id == rid and lease2.attempt == 2
    outcome = store.complete(rid, 2, "w", _result(lease2, status="failed", reward=None))
    assert outcome.status == "failed" and not outcome.retried
    rollout = store.get_rollout(rid)
    assert rollout.status == "failed" and rollout.error.type == "ValueError" and rollout.attempt == 2
    attempts = store.attempts(rid)
    assert [(a.attempt, a.status) for a in attempts] == [(1, "failed"), (2, "failed")]
    assert attempts[0].logs == ["log of attempt 1"] and attempts[0].error.traceback == "tb"


def test_expired_lease_requeues_and_late_success_is_kept(store: SQLiteStore) -> None:
    info = store.add_dataset([{"id": "t"}])
    [rid] = store.enqueue(store.dataset_tasks(info.dataset_id), max_attempts=2)
    lease = store.dequeue("w-dead", 0.01)
    assert store.heartbeat(rid, 1, "w-dead", 0.01) == "ok"
    [expired] = store.expire_leases(now=time.time() + 1)
    assert expired.retried and expired.status == "queued"
    assert "no longer running" in store.heartbeat(rid, 1, "w-dead", 10)
    lease2 = store.dequeue("w2", 10.0)
    assert lease2.attempt == 2
    # The first worker was only slow: its success still finishes the rollout.
    late = store.complete(rid, 1, "w-dead", _result(lease, reward=0.5))
    assert late.accepted and late.status == "succeeded"
    assert store.get_rollout(rid).final_reward == 0.5
    superseded = store.complete(rid, 2, "w2", _result(lease2))
    assert superseded.duplicate and not superseded.accepted and "superseded" in superseded.message
    assert store.attempts(rid)[0].error is None  # the late success overwrote the lease error for attempt 1


def test_expired_lease_without_attempts_left_fails(store: SQLiteStore) -> None:
    info = store.add_dataset([{"id": "t"}])
    [rid] = store.enqueue(store.dataset_tasks(info.dataset_id), max_attempts=1)
    store.dequeue("w", 0.01)
    [outcome] = store.expire_leases(now=time.time() + 1)
    assert outcome.status == "failed"
    rollout = store.get_rollout(rid)
    assert rollout.status == "failed" and rollout.error.type == "LeaseExpired"


def test_everything_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = SQLiteStore(path)
    info = store.add_dataset([{"id": "t1"}, {"id": "t2"}])
    ids = store.enqueue(store.dataset_tasks(info.dataset_id))
    lease = store.dequeue("w", 30.0)
    proxy = Call(rollout_id=lease.rollout_id, completion_token_ids=[9])
    store.record_proxy_call(proxy.model_dump(mode="json"), attempt=1)
    store.close()
    reopened = SQLiteStore(path)
    assert reopened.rollout_state(lease.rollout_id) == ("running", 1)
    assert [c.completion_token_ids for c in reopened.proxy_calls(lease.rollout_id)] == [[9]]
    reopened.complete(lease.rollout_id, 1, "w", _result(lease))
    assert reopened.get_rollout(lease.rollout_id).calls[0].completion_token_ids == [9]
    assert reopened.dequeue("w", 30.0).rollout_id == ids[1]
    assert reopened.get_dataset(info.dataset_id).size == 2
    reopened.close()


def test_result_of_another_finished_rollout_attempt_conflicts(store: SQLiteStore) -> None:
    info = store.add_dataset([{"id": "t"}])
    [rid] = store.enqueue(store.dataset_tasks(info.dataset_id))
    lease = store.dequeue("w", 10.0)
    store.complete(rid, 1, "w", _result(lease))
    with pytest.raises(Conflict, match="already finished"):
        store.complete(rid, 2, "w", _result(lease))


def test_list_and_cancel(store: SQLiteStore) -> None:
    info = store.add_dataset([{"id": f"t{i}"} for i in range(5)])
    ids = store.enqueue(store.dataset_tasks(info.dataset_id), dataset_id=info.dataset_id)
    assert store.cancel(ids[0]).status == "cancelled"
    assert not store.cancel(ids[0]).accepted
    rows = store.list_rollouts(status="queued", limit=2)
    assert [r.rollout_id for r in rows] == [ids[4], ids[3]]
    assert len(store.list_rollouts(dataset_id=info.dataset_id)) == 5
    assert store.finished(ids) == {ids[0]}
    with pytest.raises(NotFound):
        store.cancel("ro-unknown")
    assert json.loads(store.get_rollout(ids[0]).model_dump_json())["status"] == "cancelled"


def test_late_success_supersedes_the_running_attempt(store: SQLiteStore) -> None:
    info = store.add_dataset([{"id": "t"}])
    [rid] = store.enqueue(store.dataset_tasks(info.dataset_id), max_attempts=3)
    first = store.dequeue("slow", 0.01)
    store.expire_leases(now=time.time() + 1)
    second = store.dequeue("fast", 10.0)
    assert store.complete(rid, 1, "slow", _result(first)).status == "succeeded"
    assert [(a.attempt, a.status) for a in store.attempts(rid)] == [(1, "succeeded"), (2, "superseded")]
    assert store.complete(rid, 2, "fast", _result(second)).duplicate


def test_a_retried_rollout_waits_its_delay_then_joins_the_back_of_the_queue(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "delay.db", requeue_delay=0.3)
    first, second = store.enqueue([Task(task_id="a", payload={}), Task(task_id="b", payload={})])
    lease = store.dequeue("w", 10.0)
    assert lease.rollout_id == first and store.complete(first, 1, "w", _result(lease, status="failed")).retried
    assert store.dequeue("w", 10.0).rollout_id == second  # not the retry, though it is older
    assert store.dequeue("w", 10.0) is None  # the retry waits out its delay
    time.sleep(0.35)
    third = store.enqueue([Task(task_id="c", payload={})])[0]
    assert [store.dequeue("w", 10.0).rollout_id for _ in range(2)] == [first, third]  # by when each became leasable
    store.close()


def test_a_store_from_before_re_lease_delays_opens_and_keeps_its_queue(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    old = sqlite3.connect(path)
    old.executescript(
        SCHEMA.replace(",\n    not_before REAL)", ")").split("CREATE INDEX IF NOT EXISTS rollouts_by_queue")[0]
    )
    old.execute(
        "INSERT INTO rollouts(rollout_id, task_id, task, status, attempt, max_attempts, created) "
        "VALUES ('ro-old', 't', '{}', 'queued', 1, 3, 1.0)"
    )
    old.commit()
    old.close()
    store = SQLiteStore(path)
    assert store.dequeue("w", 10.0).rollout_id == "ro-old"
    store.close()
