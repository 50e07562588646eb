"""The durable store: datasets, tasks, rollouts, attempts, calls, rewards, model versions and workers.

:class:`Store` is the small interface the server depends on; :class:`SQLiteStore` is the embedded default
(SQLite in WAL mode, one file). Everything lives on disk, so nothing is lost on restart and memory stays bounded:
only the ids of running rollouts (for the proxy's checks) and a short buffer of proxy calls are held in RAM.
Proxy calls, the hot write path, are written in batches; every other change is one short transaction.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agentlightning.protocol import (
    AttemptInfo,
    DatasetInfo,
    Lease,
    ModelVersion,
    ResultOutcome,
    RolloutSummary,
    Task,
    dataset_id_for,
    task_id_for,
)
from agentlightning._wire.read import json_text
from agentlightning.server.join import join_calls, join_late_call
from agentlightning.server.states import decide, event_for_status, is_terminal
from agentlightning.types import Call, ErrorInfo, Reward, Rollout, new_id

logger = logging.getLogger(__name__)


class StoreError(Exception):
    """Base of the store's errors (each maps to a 4xx answer of the server)."""


class NotFound(StoreError):
    """An id that the store does not know."""


class Conflict(StoreError):
    """A request that contradicts the stored state (e.g. a result for a rollout finished by another attempt)."""


class Store(ABC):
    """What the server needs from a store. Implementations must be safe to call from several threads."""

    @abstractmethod
    def add_dataset(self, records: Sequence[Any], dataset_id: str | None = None, name: str | None = None) -> DatasetInfo:
        """Store tasks; the id defaults to a hash of the content, so uploading the same data twice is a no-op."""

    @abstractmethod
    def get_dataset(self, dataset_id: str) -> DatasetInfo | None:
        """The dataset, or None."""

    @abstractmethod
    def list_datasets(self) -> list[DatasetInfo]:
        """All datasets, oldest first."""

    @abstractmethod
    def dataset_tasks(self, dataset_id: str) -> list[Task]:
        """Tasks of a dataset in upload order (raises :class:`NotFound`)."""

    @abstractmethod
    def enqueue(
        self,
        tasks: Sequence[Task],
        *,
        group_size: int = 1,
        group_id: str | None = None,
        dataset_id: str | None = None,
        timeout: float | None = None,
        max_attempts: int = 3,
    ) -> list[str]:
        """Queue ``group_size`` rollouts per task; returns their ids (grouped per task, in task order)."""

    @abstractmethod
    def dequeue(self, worker_id: str, lease_seconds: float) -> Lease | None:
        """Lease the oldest queued rollout to ``worker_id``, or None when the queue is empty."""

    @abstractmethod
    def heartbeat(self, rollout_id: str, attempt: int, worker_id: str, lease_seconds: float) -> str:
        """Extend a lease. Returns 'ok', or the reason the worker should abandon the attempt."""

    @abstractmethod
    def complete(self, rollout_id: str, attempt: int, worker_id: str | None, result: Rollout) -> ResultOutcome:
        """Store a worker's result (idempotent per rollout and attempt); joins the proxy's calls."""

    def complete_and_dequeue(
        self, rollout_id: str, attempt: int, worker_id: str, result: Rollout, lease_seconds: float
    ) -> tuple[ResultOutcome, Lease | None]:
        """:meth:`complete`, then :meth:`dequeue` for ``worker_id`` (a store may do both in one transaction)."""
        return self.complete(rollout_id, attempt, worker_id, result), self.dequeue(worker_id, lease_seconds)

    @abstractmethod
    def expire_leases(self, now: float | None = None) -> list[ResultOutcome]:
        """Retry or fail running rollouts whose lease has expired."""

    @abstractmethod
    def cancel(self, rollout_id: str) -> ResultOutcome:
        """Cancel a queued or running rollout."""

    @abstractmethod
    def rollout_state(self, rollout_id: str) -> tuple[str, int] | None:
        """(state, attempt) of a rollout, or None if unknown. Cheap for running rollouts."""

    @abstractmethod
    def record_proxy_call(self, call: dict[str, Any], attempt: int) -> None:
        """Remember a call the proxy forwarded for ``attempt`` of a rollout (buffered while that attempt runs; see
        :meth:`flush`). ``call`` holds :class:`Call` fields, JSON-ready, with ``call_id``, ``rollout_id`` and
        ``start_time``; it is validated when read back. A call that lands after its attempt's result finished the
        rollout (e.g. in flight at the timeout) is joined into the stored rollout's calls, marked
        ``metadata["late"]``."""

    @abstractmethod
    def proxy_calls(self, rollout_id: str, attempt: int | None = None) -> list[Call]:
        """Calls the proxy recorded for a rollout (one attempt, or all), by start time."""

    @abstractmethod
    def flush(self) -> None:
        """Write buffered records."""

    @abstractmethod
    def get_rollout(self, rollout_id: str) -> Rollout | None:
        """The rollout with its calls and rewards, or None."""

    @abstractmethod
    def list_rollouts(
        self,
        *,
        status: str | None = None,
        task_id: str | None = None,
        group_id: str | None = None,
        dataset_id: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[RolloutSummary]:
        """Rollouts without their calls, newest first."""

    @abstractmethod
    def finished(self, rollout_ids: Iterable[str]) -> set[str]:
        """Which of ``rollout_ids`` are finished."""

    @abstractmethod
    def attempts(self, rollout_id: str) -> list[AttemptInfo]:
        """Every attempt of a rollout, with errors and logs."""

    @abstractmethod
    def counts(self) -> dict[str, int]:
        """Number of rollouts per state."""

    @abstractmethod
    def set_model_version(self, version: str, model_name: str, upstream_url: str | None) -> ModelVersion:
        """Record the model now served; calls recorded from now on carry this version."""

    @abstractmethod
    def current_model(self) -> ModelVersion | None:
        """The latest model version, or None."""

    @abstractmethod
    def workers(self) -> list[dict[str, Any]]:
        """Workers seen, with when they were last seen and how many rollouts they leased."""

    @abstractmethod
    def close(self) -> None:
        """Flush and close."""


_SCHEMA = """
CREATE TABLE IF NOT EXISTS datasets(
    dataset_id TEXT PRIMARY KEY, name TEXT, size INTEGER NOT NULL, created REAL NOT NULL, digest TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tasks(
    dataset_id TEXT NOT NULL, idx INTEGER NOT NULL, task_id TEXT NOT NULL, payload TEXT NOT NULL,
    PRIMARY KEY (dataset_id, idx));
CREATE TABLE IF NOT EXISTS rollouts(
    seq INTEGER PRIMARY KEY AUTOINCREMENT, rollout_id TEXT UNIQUE NOT NULL, task_id TEXT, dataset_id TEXT,
    group_id TEXT, task TEXT, status TEXT NOT NULL, attempt INTEGER NOT NULL, max_attempts INTEGER NOT NULL,
    timeout REAL, worker_id TEXT, lease_expires REAL, created REAL NOT NULL, started REAL, ended REAL,
    final_reward REAL, model_version TEXT, n_calls INTEGER, record TEXT);
CREATE INDEX IF NOT EXISTS rollouts_by_status ON rollouts(status, seq);
CREATE INDEX IF NOT EXISTS rollouts_by_lease ON rollouts(status, lease_expires);
CREATE INDEX IF NOT EXISTS rollouts_by_group ON rollouts(group_id);
CREATE INDEX IF NOT EXISTS rollouts_by_task ON rollouts(task_id);
CREATE TABLE IF NOT EXISTS attempts(
    rollout_id TEXT NOT NULL, attempt INTEGER NOT NULL, worker_id TEXT, status TEXT NOT NULL,
    started REAL, ended REAL, error TEXT, logs TEXT, PRIMARY KEY (rollout_id, attempt));
CREATE TABLE IF NOT EXISTS calls(
    rollout_id TEXT NOT NULL, sequence INTEGER NOT NULL, call_id TEXT NOT NULL, kind TEXT, role TEXT,
    body TEXT NOT NULL, PRIMARY KEY (rollout_id, sequence));
CREATE TABLE IF NOT EXISTS rewards(
    rollout_id TEXT NOT NULL, idx INTEGER NOT NULL, value REAL NOT NULL, call_id TEXT, source TEXT,
    body TEXT NOT NULL, PRIMARY KEY (rollout_id, idx));
CREATE TABLE IF NOT EXISTS proxy_calls(
    id INTEGER PRIMARY KEY AUTOINCREMENT, rollout_id TEXT NOT NULL, attempt INTEGER NOT NULL,
    start_time REAL NOT NULL, body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS proxy_calls_by_rollout ON proxy_calls(rollout_id, attempt);
CREATE TABLE IF NOT EXISTS model_versions(
    seq INTEGER PRIMARY KEY AUTOINCREMENT, version TEXT NOT NULL, model_name TEXT NOT NULL, upstream_url TEXT,
    created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS workers(
    worker_id TEXT PRIMARY KEY, first_seen REAL NOT NULL, last_seen REAL NOT NULL, leased INTEGER NOT NULL);
"""

_SUMMARY_COLUMNS = (
    "rollout_id, task_id, dataset_id, group_id, status, attempt, max_attempts, final_reward, model_version, "
    "worker_id, n_calls, created, started, ended"
)

# Proxy calls are written once this many are buffered, or when :meth:`SQLiteStore.flush` runs (the server
# flushes on a short timer and before joining a rollout's calls).
PROXY_BATCH = 256
_INSERT_PROXY_CALL = "INSERT INTO proxy_calls(rollout_id, attempt, start_time, body) VALUES (?, ?, ?, ?)"


class SQLiteStore(Store):
    """The embedded store: one SQLite file in WAL mode (``":memory:"`` works for throwaway use)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._lock = threading.RLock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA busy_timeout=10000")
            self._db.executescript(_SCHEMA)
        self._proxy_buffer: list[tuple[str, int, float, str]] = []
        self._running: dict[str, int] = dict(
            self._db.execute("SELECT rollout_id, attempt FROM rollouts WHERE status='running'").fetchall()
        )

    # -- datasets ---------------------------------------------------------------------------------------------

    def add_dataset(self, records: Sequence[Any], dataset_id: str | None = None, name: str | None = None) -> DatasetInfo:
        records = list(records)
        if not records:
            raise StoreError("dataset is empty: upload at least one task")
        for index, record in enumerate(records):
            try:
                json.dumps(record)
            except (TypeError, ValueError) as exc:
                raise StoreError(f"dataset record {index} is not JSON-serialisable: {exc}") from None
        digest = dataset_id_for(records)
        dataset_id = dataset_id or digest
        with self._lock:
            existing = self.get_dataset(dataset_id)
            if existing is not None:
                (stored,) = self._db.execute("SELECT digest FROM datasets WHERE dataset_id=?", (dataset_id,)).fetchone()
                if stored != digest:
                    raise Conflict(
                        f"dataset {dataset_id!r} already exists with different content ({existing.size} tasks); "
                        "refusing to replace it (choose another dataset_id)"
                    )
                return existing
            info = DatasetInfo(dataset_id=dataset_id, name=name, size=len(records), created=time.time())
            rows = [(dataset_id, i, task_id_for(r, dataset_id, i), json.dumps(r)) for i, r in enumerate(records)]
            with self._transaction():
                self._db.execute(
                    "INSERT INTO datasets VALUES (?, ?, ?, ?, ?)", (dataset_id, name, info.size, info.created, digest)
                )
                self._db.executemany("INSERT INTO tasks VALUES (?, ?, ?, ?)", rows)
            return info

    def get_dataset(self, dataset_id: str) -> DatasetInfo | None:
        with self._lock:
            row = self._db.execute(
                "SELECT dataset_id, name, size, created FROM datasets WHERE dataset_id=?", (dataset_id,)
            ).fetchone()
        return None if row is None else DatasetInfo(dataset_id=row[0], name=row[1], size=row[2], created=row[3])

    def list_datasets(self) -> list[DatasetInfo]:
        with self._lock:
            rows = self._db.execute("SELECT dataset_id, name, size, created FROM datasets ORDER BY created").fetchall()
        return [DatasetInfo(dataset_id=r[0], name=r[1], size=r[2], created=r[3]) for r in rows]

    def dataset_tasks(self, dataset_id: str) -> list[Task]:
        with self._lock:
            if self.get_dataset(dataset_id) is None:
                raise NotFound(f"unknown dataset {dataset_id!r}")
            rows = self._db.execute(
                "SELECT task_id, payload FROM tasks WHERE dataset_id=? ORDER BY idx", (dataset_id,)
            ).fetchall()
        return [Task(task_id=r[0], payload=json.loads(r[1])) for r in rows]

    # -- queue ------------------------------------------------------------------------------------------------

    def enqueue(
        self,
        tasks: Sequence[Task],
        *,
        group_size: int = 1,
        group_id: str | None = None,
        dataset_id: str | None = None,
        timeout: float | None = None,
        max_attempts: int = 3,
    ) -> list[str]:
        if group_size < 1:
            raise StoreError(f"group_size must be >= 1, got {group_size}")
        if max_attempts < 1:
            raise StoreError(f"max_attempts must be >= 1, got {max_attempts}")
        if timeout is not None and timeout <= 0:
            raise StoreError(f"timeout must be > 0 seconds, got {timeout}")
        prefix = group_id or new_id("g")
        now = time.time()
        rows: list[tuple[Any, ...]] = []
        ids: list[str] = []
        for task in tasks:
            payload = json.dumps(task.payload)
            for _ in range(group_size):
                rollout_id = new_id("ro")
                ids.append(rollout_id)
                rows.append(
                    (rollout_id, task.task_id, dataset_id, f"{prefix}:{task.task_id}", payload, max_attempts, timeout, now)
                )
        with self._lock, self._transaction():
            self._db.executemany(
                "INSERT INTO rollouts(rollout_id, task_id, dataset_id, group_id, task, status, attempt, max_attempts,"
                " timeout, created) VALUES (?, ?, ?, ?, ?, 'queued', 1, ?, ?, ?)",
                rows,
            )
        return ids

    def dequeue(self, worker_id: str, lease_seconds: float) -> Lease | None:
        with self._lock:
            return self._dequeue_locked(worker_id, lease_seconds)

    def _dequeue_locked(self, worker_id: str, lease_seconds: float) -> Lease | None:
        if not self._any_queued():
            return None
        with self._transaction():
            lease = self._lease_oldest(worker_id, lease_seconds, time.time())
        self._mark_running(lease)
        return lease

    def _any_queued(self) -> bool:
        return self._db.execute("SELECT 1 FROM rollouts WHERE status='queued' LIMIT 1").fetchone() is not None

    def _lease_oldest(self, worker_id: str, lease_seconds: float, now: float) -> Lease | None:
        """Lease the oldest queued rollout inside the caller's transaction (the caller marks it running once
        committed, :meth:`_mark_running`)."""
        row = self._db.execute(
            "SELECT seq, rollout_id, task_id, group_id, task, attempt, timeout FROM rollouts "
            "WHERE status='queued' ORDER BY seq LIMIT 1"
        ).fetchone()
        if row is None:
            return None
        seq, rollout_id, task_id, group_id, task, attempt, timeout = row
        self._db.execute(
            "UPDATE rollouts SET status='running', worker_id=?, lease_expires=?, started=? WHERE seq=?",
            (worker_id, now + lease_seconds, now, seq),
        )
        self._db.execute(
            "INSERT OR REPLACE INTO attempts(rollout_id, attempt, worker_id, status, started) "
            "VALUES (?, ?, ?, 'running', ?)",
            (rollout_id, attempt, worker_id, now),
        )
        self._db.execute(
            "INSERT INTO workers VALUES (?, ?, ?, 1) ON CONFLICT(worker_id) "
            "DO UPDATE SET last_seen=excluded.last_seen, leased=leased+1",
            (worker_id, now, now),
        )
        return Lease(
            rollout_id=rollout_id,
            task_id=task_id,
            task=json.loads(task),
            group_id=group_id,
            attempt=attempt,
            timeout=timeout,
            lease_seconds=lease_seconds,
        )

    def _mark_running(self, lease: Lease | None) -> None:
        if lease is not None:
            self._running[lease.rollout_id] = lease.attempt

    def heartbeat(self, rollout_id: str, attempt: int, worker_id: str, lease_seconds: float) -> str:
        now = time.time()
        with self._lock:
            row = self._db.execute("SELECT status, attempt FROM rollouts WHERE rollout_id=?", (rollout_id,)).fetchone()
            if row is None:
                raise NotFound(f"unknown rollout {rollout_id!r}")
            status, current = row
            if status != "running" or current != attempt:
                return f"attempt {attempt} of rollout {rollout_id} is no longer running (rollout is {status}, attempt {current})"
            with self._transaction():
                self._db.execute(
                    "UPDATE rollouts SET lease_expires=? WHERE rollout_id=?", (now + lease_seconds, rollout_id)
                )
                self._db.execute("UPDATE workers SET last_seen=? WHERE worker_id=?", (now, worker_id))
        return "ok"

    # -- results ------------------------------------------------------------------------------------------------

    def complete(self, rollout_id: str, attempt: int, worker_id: str | None, result: Rollout) -> ResultOutcome:
        with self._lock:
            return self._complete(rollout_id, attempt, worker_id, result, None)[0]

    def complete_and_dequeue(
        self, rollout_id: str, attempt: int, worker_id: str, result: Rollout, lease_seconds: float
    ) -> tuple[ResultOutcome, Lease | None]:
        with self._lock:  # the result and the next lease share one commit
            return self._complete(rollout_id, attempt, worker_id, result, lease_seconds)

    def _complete(
        self, rollout_id: str, attempt: int, worker_id: str | None, result: Rollout, lease_seconds: float | None
    ) -> tuple[ResultOutcome, Lease | None]:
        """Store a result; with ``lease_seconds``, also lease the next queued rollout to ``worker_id`` in the same
        transaction (the caller holds the lock)."""
        event = event_for_status(result.status)
        lease: Lease | None = None
        row = self._db.execute(
            "SELECT status, attempt, max_attempts FROM rollouts WHERE rollout_id=?", (rollout_id,)
        ).fetchone()
        if row is None:
            raise NotFound(f"unknown rollout {rollout_id!r}")
        state, current, max_attempts = row
        ended = self._db.execute(
            "SELECT status FROM attempts WHERE rollout_id=? AND attempt=? AND ended IS NOT NULL "
            "AND status != 'lease_expired'",
            (rollout_id, attempt),
        ).fetchone()
        if ended is not None or (is_terminal(state) and current == attempt):
            if lease_seconds is not None and worker_id is not None:
                lease = self._dequeue_locked(worker_id, lease_seconds)
            return ResultOutcome(
                rollout_id=rollout_id, accepted=False, duplicate=True, status=state, attempt=current,
                message=f"attempt {attempt} of rollout {rollout_id} was already reported ({ended[0] if ended else state})",
            ), lease
        if is_terminal(state):
            raise Conflict(
                f"rollout {rollout_id} already finished as {state} by attempt {current}; result of attempt "
                f"{attempt} not stored"
            )
        if attempt > current or attempt < 1:
            raise Conflict(f"rollout {rollout_id} has no attempt {attempt} (current attempt is {current})")
        now = time.time()
        if attempt < current and event != "succeed":
            # A stale attempt failing changes nothing: its rollout already moved on. Keep its error and logs.
            with self._transaction():
                self._end_attempt(rollout_id, attempt, worker_id, result.status, result.error, result.logs, now)
                if lease_seconds is not None and worker_id is not None:
                    lease = self._lease_oldest(worker_id, lease_seconds, now)
            self._mark_running(lease)
            return ResultOutcome(
                rollout_id=rollout_id, accepted=False, status=state, attempt=current,
                message=f"attempt {attempt} is stale (rollout {rollout_id} is on attempt {current}); kept its log only",
            ), lease
        decision = decide(state if attempt == current else "queued", event, attempt, max_attempts)
        with self._transaction():  # buffered proxy calls go in the same commit, kept buffered if it fails
            self._insert_proxy_buffer()
            self._end_attempt(rollout_id, attempt, worker_id, result.status, result.error, result.logs, now)
            if attempt < current and state == "running":
                superseded = ErrorInfo(type="Superseded", message=f"attempt {attempt} finished the rollout first")
                self._end_attempt(rollout_id, current, None, "superseded", superseded, [], now)
            if decision.retried:
                self._requeue(rollout_id, decision.attempt)
            else:
                self._write_final(rollout_id, attempt, decision.state, result, now)
            if lease_seconds is not None and worker_id is not None:
                lease = self._lease_oldest(worker_id, lease_seconds, now)
        self._proxy_buffer = []
        self._running.pop(rollout_id, None)
        self._mark_running(lease)
        outcome = ResultOutcome(
            rollout_id=rollout_id, accepted=True, status=decision.state, attempt=decision.attempt,
            retried=decision.retried,
        )
        return outcome, lease

    def _requeue(self, rollout_id: str, attempt: int) -> None:
        """Put a rollout back in the queue for its next ``attempt`` (transaction held)."""
        self._db.execute(
            "UPDATE rollouts SET status='queued', attempt=?, worker_id=NULL, lease_expires=NULL WHERE rollout_id=?",
            (attempt, rollout_id),
        )

    def _write_final(self, rollout_id: str, attempt: int, state: str, result: Rollout, now: float) -> None:
        """Store a finished rollout (inside a transaction, with the proxy buffer flushed)."""
        proxy = self._load_proxy_calls(rollout_id, attempt)
        calls = join_calls(rollout_id, list(result.calls), proxy)
        model_version = result.model_version or next(
            (c.metadata["model_version"] for c in calls if c.metadata.get("model_version")), None
        )
        task_id, group_id, task = self._db.execute(
            "SELECT task_id, group_id, task FROM rollouts WHERE rollout_id=?", (rollout_id,)
        ).fetchone()
        record = result.model_copy(update={
            "calls": [], "rewards": [], "status": state, "attempt": attempt, "rollout_id": rollout_id,
            "model_version": model_version, "task_id": task_id, "group_id": group_id,
            "task": json.loads(task) if task else None,
        })
        self._db.execute("DELETE FROM calls WHERE rollout_id=?", (rollout_id,))
        self._db.execute("DELETE FROM rewards WHERE rollout_id=?", (rollout_id,))
        self._insert_calls(rollout_id, calls)
        self._db.executemany(
            "INSERT INTO rewards VALUES (?, ?, ?, ?, ?, ?)",
            [(rollout_id, i, r.value, r.call_id, r.source, r.model_dump_json()) for i, r in enumerate(result.rewards)],
        )
        self._db.execute(
            "UPDATE rollouts SET status=?, attempt=?, worker_id=NULL, lease_expires=NULL, ended=?, final_reward=?, "
            "model_version=?, n_calls=?, record=? WHERE rollout_id=?",
            (state, attempt, now, result.final_reward, model_version, len(calls), record.model_dump_json(), rollout_id),
        )

    def _insert_calls(self, rollout_id: str, calls: Sequence[Call]) -> None:
        self._db.executemany(
            "INSERT INTO calls VALUES (?, ?, ?, ?, ?, ?)",
            [(rollout_id, c.sequence, c.call_id, c.kind, c.role, c.model_dump_json()) for c in calls],
        )

    def _end_attempt(
        self,
        rollout_id: str,
        attempt: int,
        worker_id: str | None,
        status: str,
        error: ErrorInfo | None,
        logs: Sequence[str],
        now: float,
    ) -> None:
        self._db.execute(
            "INSERT INTO attempts(rollout_id, attempt, worker_id, status, ended, error, logs) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(rollout_id, attempt) DO UPDATE SET "
            "worker_id=COALESCE(excluded.worker_id, worker_id), status=excluded.status, ended=excluded.ended, "
            "error=excluded.error, logs=excluded.logs",
            (
                rollout_id, attempt, worker_id, status, now,
                None if error is None else error.model_dump_json(), json.dumps(list(logs)),
            ),
        )

    def expire_leases(self, now: float | None = None) -> list[ResultOutcome]:
        now = time.time() if now is None else now
        outcomes: list[ResultOutcome] = []
        with self._lock:
            self._flush_locked()
            rows = self._db.execute(
                "SELECT rollout_id, attempt, max_attempts, worker_id, lease_expires FROM rollouts "
                "WHERE status='running' AND lease_expires < ?",
                (now,),
            ).fetchall()
            for rollout_id, attempt, max_attempts, worker_id, expires in rows:
                error = ErrorInfo(
                    type="LeaseExpired",
                    message=f"worker {worker_id} stopped reporting on attempt {attempt}; its lease expired at "
                    f"{time.strftime('%H:%M:%S', time.localtime(expires))}",
                )
                decision = decide("running", "lease_expired", attempt, max_attempts)
                with self._transaction():
                    self._end_attempt(rollout_id, attempt, worker_id, "lease_expired", error, [], now)
                    if decision.retried:
                        self._requeue(rollout_id, decision.attempt)
                    else:
                        failed = self._row_rollout(rollout_id).model_copy(update={"status": "failed", "error": error})
                        self._write_final(rollout_id, attempt, decision.state, failed, now)
                self._running.pop(rollout_id, None)
                outcomes.append(
                    ResultOutcome(
                        rollout_id=rollout_id, accepted=True, status=decision.state, attempt=decision.attempt,
                        retried=decision.retried, message=error.message,
                    )
                )
        return outcomes

    def cancel(self, rollout_id: str) -> ResultOutcome:
        with self._lock:
            state = self.rollout_state(rollout_id)
            if state is None:
                raise NotFound(f"unknown rollout {rollout_id!r}")
            status, attempt = state
            if is_terminal(status):
                return ResultOutcome(rollout_id=rollout_id, accepted=False, status=status, attempt=attempt,
                                     message=f"rollout {rollout_id} already finished as {status}")
            cancelled = self._row_rollout(rollout_id).model_copy(
                update={"status": "cancelled", "error": ErrorInfo(type="Cancelled", message="cancelled by the server")}
            )
            decision = decide(status, "cancel", attempt, attempt)
            now = time.time()
            self._flush_locked()
            with self._transaction():
                if status == "running":
                    self._end_attempt(rollout_id, attempt, None, "cancelled", cancelled.error, [], now)
                self._write_final(rollout_id, attempt, decision.state, cancelled, now)
            self._running.pop(rollout_id, None)
        return ResultOutcome(rollout_id=rollout_id, accepted=True, status=decision.state, attempt=attempt)

    # -- proxy calls ----------------------------------------------------------------------------------------------

    def rollout_state(self, rollout_id: str) -> tuple[str, int] | None:
        attempt = self._running.get(rollout_id)
        if attempt is not None:
            return "running", attempt
        with self._lock:
            row = self._db.execute("SELECT status, attempt FROM rollouts WHERE rollout_id=?", (rollout_id,)).fetchone()
        return None if row is None else (row[0], row[1])

    def record_proxy_call(self, call: dict[str, Any], attempt: int) -> None:
        rollout_id = call["rollout_id"]
        entry = (rollout_id, attempt, call["start_time"], json_text(call))
        with self._lock:
            if self._running.get(rollout_id) == attempt:
                self._proxy_buffer.append(entry)
                if len(self._proxy_buffer) >= PROXY_BATCH:
                    self._flush_locked()
                return
            self._record_late(entry)

    def _record_late(self, entry: tuple[str, int, float, str]) -> None:
        """Store a proxy call whose attempt is no longer running; join it into the rollout if that attempt finished
        it (the caller holds the lock)."""
        rollout_id, attempt = entry[0], entry[1]
        with self._transaction():
            self._insert_proxy_buffer()
            self._db.execute(_INSERT_PROXY_CALL, entry)
            row = self._db.execute(
                "SELECT status, attempt, record IS NOT NULL FROM rollouts WHERE rollout_id=?", (rollout_id,)
            ).fetchone()
            finished_by_it = row is not None and is_terminal(row[0]) and row[1] == attempt and row[2]
            if finished_by_it:
                late = _calls_from_json([entry[3]], rollout_id)
                if late:
                    stored = _calls_from_json(
                        [r[0] for r in self._db.execute(
                            "SELECT body FROM calls WHERE rollout_id=? ORDER BY sequence", (rollout_id,))],
                        rollout_id,
                    )
                    calls = join_late_call(rollout_id, stored, late[0])
                    self._db.execute("DELETE FROM calls WHERE rollout_id=?", (rollout_id,))
                    self._insert_calls(rollout_id, calls)
                    self._db.execute("UPDATE rollouts SET n_calls=? WHERE rollout_id=?", (len(calls), rollout_id))
        self._proxy_buffer = []
        if finished_by_it:
            logger.info("rollout %s: a proxy call of attempt %d landed after its result; joined as late",
                        rollout_id, attempt)

    def flush(self) -> None:
        with self._lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        if not self._proxy_buffer:
            return
        rows, self._proxy_buffer = self._proxy_buffer, []
        with self._transaction():
            self._db.executemany(_INSERT_PROXY_CALL, rows)

    def _insert_proxy_buffer(self) -> None:
        """Write the buffered proxy calls inside the caller's transaction (the caller empties the buffer once it
        committed)."""
        if self._proxy_buffer:
            self._db.executemany(_INSERT_PROXY_CALL, self._proxy_buffer)

    def proxy_calls(self, rollout_id: str, attempt: int | None = None) -> list[Call]:
        with self._lock:
            self._flush_locked()
            if attempt is None:
                rows = self._db.execute(
                    "SELECT body FROM proxy_calls WHERE rollout_id=? ORDER BY start_time, id", (rollout_id,)
                ).fetchall()
                return _calls_from_json([r[0] for r in rows], rollout_id)
            return self._load_proxy_calls(rollout_id, attempt)

    def _load_proxy_calls(self, rollout_id: str, attempt: int) -> list[Call]:
        rows = self._db.execute(
            "SELECT body FROM proxy_calls WHERE rollout_id=? AND attempt=? ORDER BY start_time, id",
            (rollout_id, attempt),
        ).fetchall()
        return _calls_from_json([r[0] for r in rows], rollout_id)

    # -- queries ------------------------------------------------------------------------------------------------

    def get_rollout(self, rollout_id: str) -> Rollout | None:
        with self._lock:
            row = self._db.execute("SELECT record FROM rollouts WHERE rollout_id=?", (rollout_id,)).fetchone()
            if row is None:
                return None
            if row[0] is None:
                return self._row_rollout(rollout_id)
            rollout = Rollout.model_validate_json(row[0])
            calls = self._db.execute(
                "SELECT body FROM calls WHERE rollout_id=? ORDER BY sequence", (rollout_id,)
            ).fetchall()
            rewards = self._db.execute(
                "SELECT body FROM rewards WHERE rollout_id=? ORDER BY idx", (rollout_id,)
            ).fetchall()
        rollout.calls = [Call.model_validate_json(r[0]) for r in calls]
        rollout.rewards = [Reward.model_validate_json(r[0]) for r in rewards]
        return rollout

    def _row_rollout(self, rollout_id: str) -> Rollout:
        """An unfinished rollout as a record, from its row."""
        row = self._db.execute(
            "SELECT task_id, group_id, task, status, attempt, model_version, created, started FROM rollouts "
            "WHERE rollout_id=?",
            (rollout_id,),
        ).fetchone()
        task_id, group_id, task, status, attempt, model_version, created, started = row
        timings = {"created": created} | ({"start": started} if started is not None else {})
        return Rollout(
            rollout_id=rollout_id, task_id=task_id, task=json.loads(task) if task else None, group_id=group_id,
            attempt=attempt, status=status, model_version=model_version, timings=timings,
        )

    def list_rollouts(
        self,
        *,
        status: str | None = None,
        task_id: str | None = None,
        group_id: str | None = None,
        dataset_id: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[RolloutSummary]:
        filters = {"status": status, "task_id": task_id, "group_id": group_id, "dataset_id": dataset_id}
        where = [f"{column}=?" for column, value in filters.items() if value is not None]
        params: list[Any] = [value for value in filters.values() if value is not None]
        sql = f"SELECT {_SUMMARY_COLUMNS} FROM rollouts"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY seq DESC LIMIT ? OFFSET ?"
        with self._lock:
            rows = self._db.execute(sql, (*params, limit, offset)).fetchall()
        names = [name.strip() for name in _SUMMARY_COLUMNS.split(",")]
        return [RolloutSummary(**dict(zip(names, row))) for row in rows]

    def attempts(self, rollout_id: str) -> list[AttemptInfo]:
        with self._lock:
            rows = self._db.execute(
                "SELECT attempt, worker_id, status, started, ended, error, logs FROM attempts WHERE rollout_id=? "
                "ORDER BY attempt",
                (rollout_id,),
            ).fetchall()
        return [
            AttemptInfo(
                rollout_id=rollout_id, attempt=r[0], worker_id=r[1], status=r[2], started=r[3], ended=r[4],
                error=None if r[5] is None else ErrorInfo.model_validate_json(r[5]),
                logs=json.loads(r[6]) if r[6] else [],
            )
            for r in rows
        ]

    def counts(self) -> dict[str, int]:
        with self._lock:
            rows = self._db.execute("SELECT status, COUNT(*) FROM rollouts GROUP BY status").fetchall()
        return dict(rows)

    def finished(self, rollout_ids: Iterable[str]) -> set[str]:
        ids = list(rollout_ids)
        done: set[str] = set()
        with self._lock:
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                marks = ",".join("?" * len(chunk))
                rows = self._db.execute(
                    f"SELECT rollout_id FROM rollouts WHERE rollout_id IN ({marks}) "
                    "AND status IN ('succeeded', 'failed', 'timeout', 'cancelled')",
                    chunk,
                ).fetchall()
                done.update(r[0] for r in rows)
        return done

    # -- models and workers -----------------------------------------------------------------------------------

    def set_model_version(self, version: str, model_name: str, upstream_url: str | None) -> ModelVersion:
        info = ModelVersion(version=version, model_name=model_name, upstream_url=upstream_url, created=time.time())
        with self._lock, self._transaction():
            self._db.execute(
                "INSERT INTO model_versions(version, model_name, upstream_url, created) VALUES (?, ?, ?, ?)",
                (version, model_name, upstream_url, info.created),
            )
        return info

    def current_model(self) -> ModelVersion | None:
        with self._lock:
            row = self._db.execute(
                "SELECT version, model_name, upstream_url, created FROM model_versions ORDER BY seq DESC LIMIT 1"
            ).fetchone()
        return None if row is None else ModelVersion(version=row[0], model_name=row[1], upstream_url=row[2], created=row[3])

    def workers(self) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute("SELECT worker_id, first_seen, last_seen, leased FROM workers ORDER BY first_seen").fetchall()
        return [{"worker_id": r[0], "first_seen": r[1], "last_seen": r[2], "leased": r[3]} for r in rows]

    def close(self) -> None:
        with self._lock:
            self._flush_locked()
            self._db.close()

    # -- internals ----------------------------------------------------------------------------------------------

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)


def _calls_from_json(bodies: Iterable[str], rollout_id: str) -> list[Call]:
    """Stored proxy records as calls; a record that is not a valid call is skipped with a warning (one bad upstream
    answer must not make its rollout's result unstorable)."""
    calls: list[Call] = []
    for body in bodies:
        try:
            calls.append(Call.model_validate_json(body))
        except ValidationError as exc:
            logger.warning("rollout %s: skipping an invalid proxy call record: %s", rollout_id, exc)
    return calls


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, rolled back on error (the caller holds the store lock)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self._db.execute("COMMIT")
        else:
            self._db.execute("ROLLBACK")
