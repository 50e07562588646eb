"""The embedded store: one SQLite file in WAL mode, one connection serialised by a lock. Every write is committed
before it is acknowledged; a write that fails raises :class:`StoreUnavailable` (proxy call records are kept for the
next commit)."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agentlightning._wire.read import json_text
from agentlightning.errors import Conflict, NotFound, StoreError, StoreUnavailable
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
from agentlightning.server._states import Decision, decide, event_for_status
from agentlightning.server.store._interface import Store
from agentlightning.server.store._lock import StoreLock
from agentlightning.server.store._schema import (
    calls_from_json,
    capture_gap,
    check_task_ids,
    check_writable,
    file_identity,
    join_calls,
    join_late_call,
    json_text_of,
    open_database,
)
from agentlightning.types import FINISHED_STATUSES, Call, ErrorInfo, Reward, Rollout, new_id

logger = logging.getLogger(__name__)

_DATASET_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
_INSERT_PROXY_CALL = "INSERT INTO proxy_calls(rollout_id, attempt, start_time, body) VALUES (?, ?, ?, ?)"
_LEASABLE = "status='queued' AND not_before <= ?"
_DATASETS = f"SELECT {', '.join(DatasetInfo.model_fields)} FROM datasets"
_SUMMARIES = f"SELECT {', '.join(RolloutSummary.model_fields)} FROM rollouts"


class SQLiteStore(Store):
    """The embedded store: one SQLite file in WAL mode (``":memory:"`` works for throwaway use). ``exclusive=True``
    (what a server opens it with) holds the file's lock until :meth:`close`: another exclusive opening, in any
    process, raises :class:`StoreInUse`; and it resumes the stored leases (:meth:`_resume_leases`). Readers open it
    without.

    Its times (lease deadlines, re-lease delays, and the times it records) are read from the wall clock once, when
    the store is opened, and advanced by the monotonic clock from then on: a wall-clock step (NTP, a VM resumed, an
    operator) neither expires every lease at once nor keeps a dead worker's lease for the length of the step."""

    def __init__(
        self,
        path: str | Path,
        *,
        requeue_delay: float = 2.0,
        requeue_delay_max: float = 60.0,
        exclusive: bool = False,
        lease_seconds: float = 30.0,
    ) -> None:
        self.path = str(path)
        self.requeue_delay, self.requeue_delay_max = requeue_delay, requeue_delay_max
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._lock_file = StoreLock(self.path) if exclusive and self.path != ":memory:" else None
        try:
            self._db = open_database(self.path)
        except BaseException:
            self._release_lock()
            raise
        self._identity = file_identity(self.path)
        self._problem: str | None = None  # why the last write failed, until one succeeds
        self._lock = threading.RLock()
        self._proxy_buffer: list[tuple[str, int, float, str]] = []  # records whose write failed
        self._capture_gaps = 0  # rollouts stored with proxy calls that in-process capture missed
        self._running = dict(self._all("SELECT rollout_id, attempt FROM rollouts WHERE status='running'"))
        self._wall_at_open = time.time() - time.monotonic()
        if exclusive:
            self._resume_leases(lease_seconds)

    def _now(self) -> float:
        """The store's clock: the wall clock as read at open, advanced by the monotonic clock since."""
        return self._wall_at_open + time.monotonic()

    def _resume_leases(self, lease_seconds: float) -> None:
        """A server (re)starting on the store: stored deadlines were set on the last server's clock, and the wall
        clock may have stepped while none ran. Each running lease gets ``lease_seconds`` from now (its worker may have
        waited out the restart: its next heartbeat keeps it), and no re-lease delay ends later than
        ``requeue_delay_max`` from now."""
        now = self._now()
        with self._lock, contextlib.suppress(StoreUnavailable):  # logged; the stored deadlines stay
            with self._transaction():
                self._db.execute("UPDATE rollouts SET lease_expires=? WHERE status='running'", (now + lease_seconds,))
                latest = now + self.requeue_delay_max
                self._db.execute(
                    "UPDATE rollouts SET not_before=? WHERE status='queued' AND not_before > ?", (latest, latest)
                )

    def add_dataset(
        self, records: Sequence[Any], dataset_id: str | None = None, name: str | None = None
    ) -> DatasetInfo:
        records = list(records)
        if not records:
            raise StoreError("dataset is empty: upload at least one task")
        if dataset_id is not None and not (isinstance(dataset_id, str) and _DATASET_ID.fullmatch(dataset_id)):
            raise StoreError(
                f"dataset_id must be 1-128 letters, digits and ._:- starting with a letter or digit, got {dataset_id!r}"
            )
        if name is not None and not isinstance(name, str):
            raise StoreError(f"dataset name must be a string, got {type(name).__name__}")
        payloads = [json_text_of(record, f"dataset record {index}") for index, record in enumerate(records)]
        digest = dataset_id_for(records)
        dataset_id = dataset_id or digest
        check_task_ids([(task_id_for(r, dataset_id, i), payloads[i]) for i, r in enumerate(records)])
        with self._lock:
            existing = self.get_dataset(dataset_id)
            if existing is not None:
                if self._one("SELECT digest FROM datasets WHERE dataset_id=?", dataset_id)[0] != digest:
                    raise Conflict(
                        f"dataset {dataset_id!r} already exists with different content ({existing.size} "
                        "tasks); refusing to replace it (choose another dataset_id)"
                    )
                return existing
            info = DatasetInfo(dataset_id=dataset_id, name=name, size=len(records), created=self._now())
            rows = [(dataset_id, i, task_id_for(r, dataset_id, i), payloads[i]) for i, r in enumerate(records)]
            with self._transaction():
                self._db.execute(
                    "INSERT INTO datasets VALUES (?, ?, ?, ?, ?)", (dataset_id, name, info.size, info.created, digest)
                )
                self._db.executemany("INSERT INTO tasks VALUES (?, ?, ?, ?)", rows)
        return info

    def get_dataset(self, dataset_id: str) -> DatasetInfo | None:
        row = self._one(f"{_DATASETS} WHERE dataset_id=?", dataset_id)
        return None if row is None else DatasetInfo(**row)

    def list_datasets(self) -> list[DatasetInfo]:
        return [DatasetInfo(**row) for row in self._all(f"{_DATASETS} ORDER BY created")]

    def dataset_tasks(self, dataset_id: str) -> list[Task]:
        with self._lock:
            if self.get_dataset(dataset_id) is None:
                raise NotFound(f"unknown dataset {dataset_id!r}")
            rows = self._all("SELECT task_id, payload FROM tasks WHERE dataset_id=? ORDER BY idx", dataset_id)
        return [Task(task_id=r["task_id"], payload=json.loads(r["payload"])) for r in rows]

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
        now = self._now()
        payloads = [json_text_of(task.payload, f"task {index}") for index, task in enumerate(tasks)]
        check_task_ids([(task.task_id, payload) for task, payload in zip(tasks, payloads, strict=True)])
        rows = [
            (
                new_id("ro"),
                task.task_id,
                dataset_id,
                f"{prefix}:{task.task_id}",
                payload,
                max_attempts,
                timeout,
                now,
                now,
            )
            for task, payload in zip(tasks, payloads, strict=True)
            for _ in range(group_size)
        ]
        with self._lock, self._transaction():
            self._db.executemany(
                "INSERT INTO rollouts(rollout_id, task_id, dataset_id, group_id, task, status, "
                "attempt, max_attempts, timeout, created, not_before) "
                "VALUES (?, ?, ?, ?, ?, 'queued', 1, ?, ?, ?, ?)",
                rows,
            )
        return [row[0] for row in rows]

    def dequeue(self, worker_id: str, lease_seconds: float) -> Lease | None:
        with self._lock:
            if self._one(f"SELECT 1 FROM rollouts WHERE {_LEASABLE} LIMIT 1", self._now()) is None:
                return None  # an empty queue costs no write transaction
            with self._transaction():
                lease = self._lease_oldest(worker_id, lease_seconds, self._now())
            if lease is not None:
                self._running[lease.rollout_id] = lease.attempt
        return lease

    def _handed_again(
        self, rollout_id: str, attempt: int, worker_id: str, lease_seconds: float, now: float
    ) -> Lease | None:
        """The lease handed with the answer to ``worker_id``'s result of ``attempt``, extended, if the worker still
        holds it (inside the caller's transaction)."""
        handed = self._one(
            "SELECT handed_rollout, handed_attempt FROM attempts WHERE rollout_id=? AND attempt=? AND worker_id=?",
            rollout_id,
            attempt,
            worker_id,
        )
        if handed is None or handed[0] is None:
            return None
        row = self._one(
            "SELECT rollout_id, task_id, group_id, task, attempt, timeout FROM rollouts "
            "WHERE rollout_id=? AND attempt=? AND status='running' AND worker_id=?",
            handed[0],
            handed[1],
            worker_id,
        )
        if row is None:
            return None
        self._db.execute("UPDATE rollouts SET lease_expires=? WHERE rollout_id=?", (now + lease_seconds, handed[0]))
        return Lease(**{**row, "task": json.loads(row["task"])}, lease_seconds=lease_seconds)

    def _lease_oldest(self, worker_id: str, lease_seconds: float, now: float) -> Lease | None:
        """Lease the oldest queued rollout in the caller's transaction (the caller marks it running once committed)."""
        row = self._one(
            f"SELECT rollout_id, task_id, group_id, task, attempt, timeout FROM rollouts WHERE {_LEASABLE} "
            "ORDER BY not_before, seq LIMIT 1",
            now,
        )
        if row is None:
            return None
        self._db.execute(
            "UPDATE rollouts SET status='running', worker_id=?, lease_expires=?, started=?, model_version="
            "(SELECT version FROM model_versions ORDER BY seq DESC LIMIT 1) WHERE rollout_id=?",
            (worker_id, now + lease_seconds, now, row["rollout_id"]),
        )
        self._db.execute(
            "INSERT OR REPLACE INTO attempts(rollout_id, attempt, worker_id, status, started) "
            "VALUES (?, ?, ?, 'running', ?)",
            (row["rollout_id"], row["attempt"], worker_id, now),
        )
        self._db.execute(
            "INSERT INTO workers VALUES (?, ?, ?, 1) ON CONFLICT(worker_id) "
            "DO UPDATE SET last_seen=excluded.last_seen, leased=leased+1",
            (worker_id, now, now),
        )
        return Lease(**{**row, "task": json.loads(row["task"])}, lease_seconds=lease_seconds)

    def heartbeat(self, rollout_id: str, attempt: int, worker_id: str, lease_seconds: float) -> str:
        now = self._now()
        with self._lock:
            status, current, holder = self._rollout(rollout_id, "status, attempt, worker_id")
            if status != "running" or current != attempt:
                return (
                    f"attempt {attempt} of rollout {rollout_id} is no longer running "
                    f"(rollout is {status}, attempt {current})"
                )
            if holder != worker_id:
                return f"attempt {attempt} of rollout {rollout_id} is leased to worker {holder}, not {worker_id}"
            with self._transaction():
                expires = now + lease_seconds
                self._db.execute("UPDATE rollouts SET lease_expires=? WHERE rollout_id=?", (expires, rollout_id))
                self._db.execute("UPDATE workers SET last_seen=? WHERE worker_id=?", (now, worker_id))
        return "ok"

    def complete(self, rollout_id: str, attempt: int, worker_id: str | None, result: Rollout) -> ResultOutcome:
        return self.complete_and_dequeue(rollout_id, attempt, worker_id, result, None)[0]

    def complete_and_dequeue(
        self, rollout_id: str, attempt: int, worker_id: str | None, result: Rollout, lease_seconds: float | None
    ) -> tuple[ResultOutcome, Lease | None]:
        """Store a result; with ``lease_seconds`` (and a worker), also lease the next queued rollout to ``worker_id``
        in the same commit, remembered with the result: a re-sent result (its answer was lost, perhaps with a server
        killed before sending it) gets that same lease again while the worker holds it."""
        event = event_for_status(result.status)
        lease: Lease | None = None
        with self._lock:
            with self._transaction():
                outcome = self._store_result(rollout_id, attempt, worker_id, result, event)
                if lease_seconds is not None and worker_id is not None:
                    now = self._now()
                    if outcome.duplicate:
                        lease = self._handed_again(rollout_id, attempt, worker_id, lease_seconds, now)
                    lease = lease or self._lease_oldest(worker_id, lease_seconds, now)
                    if lease is not None:
                        self._db.execute(
                            "UPDATE attempts SET handed_rollout=?, handed_attempt=? WHERE rollout_id=? AND attempt=?",
                            (lease.rollout_id, lease.attempt, rollout_id, attempt),
                        )
            if outcome.accepted:
                self._running.pop(rollout_id, None)
            if lease is not None:
                self._running[lease.rollout_id] = lease.attempt
        return outcome, lease

    def _store_result(
        self, rollout_id: str, attempt: int, worker_id: str | None, result: Rollout, event: str
    ) -> ResultOutcome:
        """Apply one result inside the caller's transaction."""
        state, current, max_attempts = self._rollout(rollout_id, "status, attempt, max_attempts")
        ended = self._one(
            "SELECT status, ended IS NOT NULL AND status != 'lease_expired', worker_id FROM attempts "
            "WHERE rollout_id=? AND attempt=?",
            rollout_id,
            attempt,
        )
        if (ended is not None and ended[1]) or (state in FINISHED_STATUSES and current == attempt):
            reported = ended[0] if ended else state
            return ResultOutcome(
                rollout_id=rollout_id,
                accepted=False,
                duplicate=True,
                status=state,
                attempt=current,
                message=f"attempt {attempt} of rollout {rollout_id} was already reported ({reported})",
            )
        if state in FINISHED_STATUSES:
            raise Conflict(
                f"rollout {rollout_id} already finished as {state} by attempt {current}; result of attempt "
                f"{attempt} not stored"
            )
        if attempt > current or attempt < 1 or ended is None:
            raise Conflict(f"rollout {rollout_id} has no attempt {attempt} (current attempt is {current})")
        if ended[2] != worker_id:
            raise Conflict(
                f"attempt {attempt} of rollout {rollout_id} was leased to worker {ended[2]}, not "
                f"{worker_id}; result not stored"
            )
        now = self._now()
        self._end_attempt(rollout_id, attempt, worker_id, result.status, result.error, result.logs, now)
        if attempt < current and event != "succeed":
            # A stale attempt failing changes nothing: its rollout already moved on. Keep its error and logs.
            return ResultOutcome(
                rollout_id=rollout_id,
                accepted=False,
                status=state,
                attempt=current,
                message=f"attempt {attempt} is stale (rollout {rollout_id} is on attempt {current}); kept its log only",
            )
        decision = decide(state if attempt == current else "queued", event, attempt, max_attempts)
        if attempt < current and state == "running":
            superseded = ErrorInfo(type="Superseded", message=f"attempt {attempt} finished the rollout first")
            self._end_attempt(rollout_id, current, None, "superseded", superseded, [], now)
        self._finish(rollout_id, attempt, decision, result, now)
        return ResultOutcome(
            rollout_id=rollout_id,
            accepted=True,
            status=decision.state,
            attempt=decision.attempt,
            retried=decision.retried,
        )

    def _finish(self, rollout_id: str, attempt: int, decision: Decision, result: Rollout, now: float) -> None:
        """End ``attempt`` as decided: queue the rollout for its next attempt, or store it as final ``result``."""
        if decision.retried:
            delay = min(self.requeue_delay * 2 ** (decision.attempt - 2), self.requeue_delay_max)
            self._db.execute(
                "UPDATE rollouts SET status='queued', attempt=?, worker_id=NULL, lease_expires=NULL, "
                "not_before=? WHERE rollout_id=?",
                (decision.attempt, self._now() + delay, rollout_id),
            )
        else:
            self._write_final(rollout_id, attempt, decision.state, result, now)

    def _write_final(self, rollout_id: str, attempt: int, state: str, result: Rollout, now: float) -> None:
        """Store a finished rollout, its calls joined with the attempt's proxy calls. Its task, group and model
        version are the stored ones (the version was recorded when the attempt was leased)."""
        calls = join_calls(rollout_id, list(result.calls), self.proxy_calls(rollout_id, attempt))
        row = self._rollout(rollout_id, "task_id, group_id, task, model_version")
        diagnostics = list(result.diagnostics)
        if gap := capture_gap(calls):
            diagnostics.append(f"not every LLM call was captured in-process: {gap.note}")
            self._report_capture_gap(rollout_id, gap.note)
        record = result.model_copy(
            update={
                "calls": [],
                "rewards": [],
                "diagnostics": diagnostics,
                "status": state,
                "attempt": attempt,
                "rollout_id": rollout_id,
                **row,
                "task": json.loads(row["task"]),
            }
        )
        self._replace_calls(rollout_id, calls)
        self._db.execute("DELETE FROM rewards WHERE rollout_id=?", (rollout_id,))
        self._db.executemany(
            "INSERT INTO rewards VALUES (?, ?, ?, ?, ?, ?)",
            [(rollout_id, i, r.value, r.call_id, r.source, r.model_dump_json()) for i, r in enumerate(result.rewards)],
        )
        self._db.execute(
            "UPDATE rollouts SET status=?, attempt=?, worker_id=NULL, lease_expires=NULL, ended=?, "
            "final_reward=?, record=? WHERE rollout_id=?",
            (state, attempt, now, result.final_reward, record.model_dump_json(), rollout_id),
        )

    def _report_capture_gap(self, rollout_id: str, note: str) -> None:
        """Warn about the first rollout whose calls capture missed (once per store: once per server run); log the
        later ones at INFO, each with the count of rollouts affected so far."""
        self._capture_gaps += 1
        if self._capture_gaps == 1:
            logger.warning(
                "rollout %s: %s This warning is shown once per run; later rollouts with missed calls are listed in "
                "their diagnostics and counted in the calls/proxy_only metric of agl.train.",
                rollout_id,
                note,
            )
        else:
            logger.info("rollout %s (%d rollouts with missed calls so far): %s", rollout_id, self._capture_gaps, note)

    def _replace_calls(self, rollout_id: str, calls: Sequence[Call]) -> None:
        self._db.execute("DELETE FROM calls WHERE rollout_id=?", (rollout_id,))
        self._db.executemany(
            "INSERT INTO calls VALUES (?, ?, ?, ?, ?, ?)",
            [(rollout_id, c.sequence, c.call_id, c.kind, c.role, c.model_dump_json()) for c in calls],
        )
        self._db.execute("UPDATE rollouts SET n_calls=? WHERE rollout_id=?", (len(calls), rollout_id))

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
            "worker_id=COALESCE(excluded.worker_id, worker_id), status=excluded.status, "
            "ended=excluded.ended, error=excluded.error, logs=excluded.logs",
            (rollout_id, attempt, worker_id, status, now, error and error.model_dump_json(), json.dumps(list(logs))),
        )

    def expire_leases(self, now: float | None = None) -> list[ResultOutcome]:
        now = self._now() if now is None else now
        outcomes: list[ResultOutcome] = []
        with self._lock:
            rows = self._all(
                "SELECT rollout_id, attempt, max_attempts, worker_id, lease_expires FROM rollouts "
                "WHERE status='running' AND lease_expires < ?",
                now,
            )
            for rollout_id, attempt, max_attempts, worker_id, expires in rows:
                expired_at = time.strftime("%H:%M:%S", time.localtime(expires))
                error = ErrorInfo(
                    type="LeaseExpired",
                    message=f"worker {worker_id} stopped reporting on attempt "
                    f"{attempt}; its lease expired at {expired_at}",
                )
                decision = decide("running", "lease_expired", attempt, max_attempts)
                self._end_unreported(rollout_id, attempt, worker_id, "lease_expired", decision, "failed", error, now)
                outcomes.append(
                    ResultOutcome(
                        rollout_id=rollout_id,
                        accepted=True,
                        status=decision.state,
                        attempt=decision.attempt,
                        retried=decision.retried,
                        message=error.message,
                    )
                )
        return outcomes

    def cancel(self, rollout_id: str) -> ResultOutcome:
        with self._lock:
            status, attempt = self._rollout(rollout_id, "status, attempt")
            if status in FINISHED_STATUSES:
                return ResultOutcome(
                    rollout_id=rollout_id,
                    accepted=False,
                    status=status,
                    attempt=attempt,
                    message=f"rollout {rollout_id} already finished as {status}",
                )
            decision = decide(status, "cancel", attempt, attempt)
            error = ErrorInfo(type="Cancelled", message="cancelled by the server")
            self._end_unreported(
                rollout_id,
                attempt,
                None,
                "cancelled" if status == "running" else None,
                decision,
                "cancelled",
                error,
                self._now(),
            )
        return ResultOutcome(rollout_id=rollout_id, accepted=True, status=decision.state, attempt=attempt)

    def _end_unreported(
        self,
        rollout_id: str,
        attempt: int,
        worker_id: str | None,
        ended_as: str | None,
        decision: Decision,
        status: str,
        error: ErrorInfo,
        now: float,
    ) -> None:
        """End a rollout's attempt that no worker reported, ``ended_as`` in its log (None: it never started), and the
        rollout as decided (a final one stored as ``status`` with ``error``)."""
        with self._transaction():
            if ended_as is not None:
                self._end_attempt(rollout_id, attempt, worker_id, ended_as, error, [], now)
            record = self._row_rollout(rollout_id).model_copy(update={"status": status, "error": error})
            self._finish(rollout_id, attempt, decision, record, now)
        self._running.pop(rollout_id, None)

    def rollout_state(self, rollout_id: str) -> tuple[str, int] | None:
        attempt = self._running.get(rollout_id)
        if attempt is not None:
            return "running", attempt
        row = self._one("SELECT status, attempt FROM rollouts WHERE rollout_id=?", rollout_id)
        return None if row is None else (row[0], row[1])

    def attempt_state(self, rollout_id: str, attempt: int) -> tuple[str, str | None] | None:
        if self._running.get(rollout_id) == attempt:
            return "running", "running"
        with self._lock:
            row = self._one("SELECT status FROM rollouts WHERE rollout_id=?", rollout_id)
            if row is None:
                return None
            ended = self._one("SELECT status FROM attempts WHERE rollout_id=? AND attempt=?", rollout_id, attempt)
        return row[0], None if ended is None else ended[0]

    def record_proxy_call(self, call: dict[str, Any], attempt: int) -> None:
        rollout_id = call["rollout_id"]
        entry = (rollout_id, attempt, call["start_time"], json_text(call))
        with self._lock:
            self._proxy_buffer.append(entry)  # written by the transaction, kept for the next one if it fails
            with self._transaction():  # joined now if its attempt is over and finished the rollout
                joined = self._running.get(rollout_id) != attempt and self._join_late(rollout_id, attempt, entry[3])
        if joined:
            logger.info(
                "rollout %s: a proxy call of attempt %d landed after its result; joined as late", rollout_id, attempt
            )

    def _join_late(self, rollout_id: str, attempt: int, body: str) -> bool:
        """Join a proxy call into its stored rollout if ``attempt`` finished it (inside a transaction)."""
        row = self._one("SELECT status, attempt, record IS NOT NULL FROM rollouts WHERE rollout_id=?", rollout_id)
        finished_by_it = row is not None and row[0] in FINISHED_STATUSES and row[1] == attempt and row[2]
        late = calls_from_json([body], rollout_id) if finished_by_it else []
        if late:
            self._replace_calls(rollout_id, join_late_call(rollout_id, self._stored_calls(rollout_id), late[0]))
        return bool(late)

    def flush(self) -> None:
        with self._lock, contextlib.suppress(StoreUnavailable):  # logged by the failed transaction; kept for later
            if self._proxy_buffer:
                with self._transaction():  # writes the buffer
                    pass

    def proxy_calls(self, rollout_id: str, attempt: int | None = None) -> list[Call]:
        rows = self._all("SELECT attempt, body FROM proxy_calls WHERE rollout_id=? ORDER BY start_time, id", rollout_id)
        return calls_from_json([body for n, body in rows if attempt is None or n == attempt], rollout_id)

    def get_rollout(self, rollout_id: str) -> Rollout | None:
        with self._lock:
            row = self._one("SELECT record FROM rollouts WHERE rollout_id=?", rollout_id)
            if row is None:
                return None
            if row[0] is None:
                return self._row_rollout(rollout_id)
            rewards = self._all("SELECT body FROM rewards WHERE rollout_id=? ORDER BY idx", rollout_id)
            rollout = Rollout.model_validate_json(row[0])
            rollout.calls = self._stored_calls(rollout_id)
        rollout.rewards = [Reward.model_validate_json(r[0]) for r in rewards]
        return rollout

    def _stored_calls(self, rollout_id: str) -> list[Call]:
        rows = self._all("SELECT body FROM calls WHERE rollout_id=? ORDER BY sequence", rollout_id)
        return [Call.model_validate_json(r[0]) for r in rows]

    def _row_rollout(self, rollout_id: str) -> Rollout:
        """An unfinished rollout as a record, from its row."""
        row = self._rollout(rollout_id, "task_id, group_id, task, status, attempt, model_version, created, started")
        timings = {"created": row["created"]} | ({"start": row["started"]} if row["started"] is not None else {})
        return Rollout(
            rollout_id=rollout_id,
            task_id=row["task_id"],
            task=json.loads(row["task"]),
            group_id=row["group_id"],
            attempt=row["attempt"],
            status=row["status"],
            model_version=row["model_version"],
            timings=timings,
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
        given = {column: value for column, value in filters.items() if value is not None}
        where = " WHERE " + " AND ".join(f"{column}=?" for column in given) if given else ""
        rows = self._all(f"{_SUMMARIES}{where} ORDER BY seq DESC LIMIT ? OFFSET ?", *given.values(), limit, offset)
        return [RolloutSummary(**row) for row in rows]

    def attempts(self, rollout_id: str) -> list[AttemptInfo]:
        rows = self._all("SELECT * FROM attempts WHERE rollout_id=? ORDER BY attempt", rollout_id)
        return [
            AttemptInfo(**{**row, "error": json.loads(row["error"] or "null"), "logs": json.loads(row["logs"] or "[]")})
            for row in rows
        ]

    def counts(self) -> dict[str, int]:
        return dict(self._all("SELECT status, COUNT(*) FROM rollouts GROUP BY status"))

    def finished(self, rollout_ids: Iterable[str]) -> set[str]:
        rows = self._all(
            "SELECT rollout_id, status FROM rollouts WHERE rollout_id IN (SELECT value FROM json_each(?))",
            json.dumps(list(rollout_ids)),
        )  # the ids as one JSON parameter: any number of them
        return {rollout_id for rollout_id, status in rows if status in FINISHED_STATUSES}

    def set_model_version(self, version: str, model_name: str, upstream_url: str | None) -> ModelVersion:
        info = ModelVersion(version=version, model_name=model_name, upstream_url=upstream_url, created=self._now())
        with self._lock, self._transaction():
            self._db.execute(
                "INSERT INTO model_versions(version, model_name, upstream_url, created) VALUES (?, ?, ?, ?)",
                (version, model_name, upstream_url, info.created),
            )
        return info

    def current_model(self) -> ModelVersion | None:
        row = self._one(f"SELECT {', '.join(ModelVersion.model_fields)} FROM model_versions ORDER BY seq DESC LIMIT 1")
        return None if row is None else ModelVersion(**row)

    def workers(self) -> list[dict[str, Any]]:
        rows = self._all("SELECT worker_id, first_seen, last_seen, leased FROM workers ORDER BY first_seen")
        return [dict(row) for row in rows]

    def health(self) -> str | None:
        try:
            check_writable(self.path, self._identity)
        except StoreUnavailable as exc:
            return str(exc)
        return self._problem

    def close(self) -> None:
        with self._lock:
            self.flush()
            if self._proxy_buffer:
                logger.error(
                    "closing the store with %d proxy call records unwritten: %s", len(self._proxy_buffer), self._problem
                )
            self._db.close()
        self._release_lock()

    def _release_lock(self) -> None:
        if self._lock_file is not None:
            self._lock_file.release()

    def _rollout(self, rollout_id: str, columns: str) -> Any:
        """``columns`` of a rollout's row; raises :class:`NotFound` for an unknown rollout."""
        row = self._one(f"SELECT {columns} FROM rollouts WHERE rollout_id=?", rollout_id)
        if row is None:
            raise NotFound(f"unknown rollout {rollout_id!r}")
        return row

    def _one(self, sql: str, *params: Any) -> Any:
        with self._lock:
            return self._db.execute(sql, params).fetchone()

    def _all(self, sql: str, *params: Any) -> list[Any]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """BEGIN IMMEDIATE ... COMMIT, rolled back on error, with the buffered proxy calls written first (they stay
        buffered if the commit fails). A store that cannot be written raises :class:`StoreUnavailable`. The caller
        holds the lock."""
        try:
            check_writable(self.path, self._identity)
            self._db.execute("BEGIN IMMEDIATE")
            with self._db:  # commits, or rolls back and re-raises
                self._db.executemany(_INSERT_PROXY_CALL, self._proxy_buffer)
                yield
        except (StoreUnavailable, sqlite3.OperationalError) as exc:  # disk I/O error, read-only, full, locked
            if self._problem is None:
                logger.error("the store cannot be written, refusing work until it can: %s", exc)
            self._problem = str(exc) if isinstance(exc, StoreUnavailable) else f"{self.path} cannot be written ({exc})"
            raise StoreUnavailable(self._problem) from None
        self._proxy_buffer, self._problem = [], None
