"""Read-only queries over a store file for the dashboard: filtered, sorted pages of rollouts (never all of them),
one rollout with every attempt, tasks and their GRPO groups. Its own read-only connection: a live server's writes
are not blocked by it (WAL), and ``agl dashboard`` cannot change the run it looks at."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import threading
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from agentlightning.errors import NotFound
from agentlightning.server.store._schema import capture_gap
from agentlightning.types import FINISHED_STATUSES, MISSED_BY_CAPTURE, Call

FAILED = "('failed', 'timeout', 'cancelled')"  # the finished states that are not a success, as SQL
SORTS = {
    "created": "seq",
    "ended": "ended",
    "reward": "final_reward",
    "calls": "n_calls",
    "attempt": "attempt",
    "duration": "ended - started",
}
COUNT_CAP = 10_000
MAX_OFFSET = 10**12  # past any store's rows; the largest offset or limit a request may name (SQLite takes < 2**63)
_CLAUSES = {
    "status": "status=?",
    "task_id": "task_id=?",
    "group_id": "group_id=?",
    "model_version": "model_version=?",
    "reward_min": "final_reward >= ?",
    "reward_max": "final_reward <= ?",
    "failed": f"status IN {FAILED}",
    "retried": "attempt > 1",
    "role": "EXISTS (SELECT 1 FROM calls c WHERE c.role=? AND c.rollout_id=rollouts.rollout_id)",
}
TASK_SORTS = {"task": "task_id", "rollouts": "n", "reward": "mean_reward", "last": "last_seq"}
_ROW = (
    "rollout_id, task_id, group_id, status, attempt, max_attempts, final_reward, model_version, worker_id, "
    "n_calls, created, started, ended"
)
_TOKEN_FIELDS = ("prompt_token_ids", "completion_token_ids", "completion_logprobs")


class RolloutQuery(BaseModel):
    """Filters (each given one must hold), order and page of :meth:`StoreReader.rollouts`; ``failed`` means failed,
    timed out or cancelled, ``retried`` more than one attempt."""

    status: str | None = None
    failed: bool = False
    retried: bool = False
    task_id: str | None = None
    group_id: str | None = None
    role: str | None = None
    model_version: str | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    sort: Literal["created", "ended", "reward", "calls", "attempt", "duration"] = "created"
    desc: bool = True
    limit: int = Field(default=50, ge=1, le=500)
    offset: int = Field(default=0, ge=0, le=MAX_OFFSET)


class StoreReader:
    """Read-only view of the SQLite store at ``path`` (raises FileNotFoundError when there is none)."""

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no store file at {path}")
        self.path = path
        self._db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._lock = threading.Lock()

    def _all(self, sql: str, *params: Any) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(row) for row in self._db.execute(sql, params).fetchall()]

    def rollouts(self, query: RolloutQuery) -> dict[str, Any]:
        """One page of rollouts matching every filter given in ``query``, and how many match in all."""
        given = {
            name: value
            for name, value in query.model_dump(include=set(_CLAUSES)).items()
            if value is not None and value != "" and value is not False
        }
        clauses = [_CLAUSES[name] for name in given]
        params = [value for value in given.values() if value is not True]
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        order, sort, limit, offset = "DESC" if query.desc else "ASC", query.sort, query.limit, query.offset
        # Newest first walks the primary key and stops after the page, by reward its index; empty values go last.
        by = f"seq {order}" if sort == "created" else f"{SORTS[sort]} {order} NULLS LAST, seq {order}"
        rows = self._all(
            f"SELECT {_ROW}, json_extract(record, '$.error.type') AS error_type, "
            f"json_extract(record, '$.error.message') AS error FROM rollouts{where} ORDER BY {by} LIMIT ? OFFSET ?",
            *params,
            limit,
            offset,
        )
        # A filtered count stops at COUNT_CAP matches past the page: counting all 100k rollouts of a role would
        # cost more than the page itself. ``more`` says the count was cut.
        cap = offset + limit + COUNT_CAP if clauses else -1
        total = self._all(f"SELECT COUNT(*) AS n FROM (SELECT 1 FROM rollouts{where} LIMIT ?)", *params, cap)[0]["n"]
        missed = self._missed_by_capture([row["rollout_id"] for row in rows])
        for row in rows:
            row[MISSED_BY_CAPTURE] = missed.get(row["rollout_id"], 0)
        return {"rows": rows, "total": total, "more": total == cap, "limit": limit, "offset": offset}

    def _missed_by_capture(self, rollout_ids: list[str]) -> dict[str, int]:
        """How many stored calls of each of these rollouts in-process capture missed (only those with any)."""
        rows = self._all(
            "SELECT rollout_id, COUNT(*) AS n FROM calls WHERE rollout_id IN (SELECT value FROM json_each(?)) "
            f"AND json_extract(body, '$.metadata.{MISSED_BY_CAPTURE}') GROUP BY rollout_id",
            json.dumps(rollout_ids),
        )
        return {row["rollout_id"]: row["n"] for row in rows}

    def rollout(self, rollout_id: str) -> dict[str, Any]:
        """A rollout with its calls (token ids summarised), rewards, every attempt and its capture gap (LLM calls the
        proxy served that in-process capture missed, or None); a running rollout shows the calls its current attempt
        made so far, a retried one the calls of each earlier attempt."""
        found = self._all(f"SELECT {_ROW}, task, record FROM rollouts WHERE rollout_id=?", rollout_id)
        if not found:
            raise NotFound(f"unknown rollout {rollout_id!r}")
        row = found[0]
        record = json.loads(row.pop("record") or "null") or {"task": json.loads(row["task"]), "logs": []}
        row.pop("task")
        bodies = self._all("SELECT body FROM calls WHERE rollout_id=? ORDER BY sequence", rollout_id)
        proxied = self._all(
            "SELECT attempt, body FROM proxy_calls WHERE rollout_id=? ORDER BY start_time, id", rollout_id
        )
        attempts = self._all("SELECT * FROM attempts WHERE rollout_id=? ORDER BY attempt", rollout_id)
        stored_attempt = row["attempt"] if row["status"] in FINISHED_STATUSES else None
        for attempt in attempts:
            attempt["error"] = json.loads(attempt["error"] or "null")
            attempt["logs"] = json.loads(attempt["logs"] or "[]")
            attempt["calls"] = (
                []
                if attempt["attempt"] == stored_attempt
                else [_summarised(json.loads(p["body"])) for p in proxied if p["attempt"] == attempt["attempt"]]
            )
        rewards = self._all("SELECT body FROM rewards WHERE rollout_id=? ORDER BY idx", rollout_id)
        calls = [json.loads(b["body"]) for b in bodies]
        gap = capture_gap([Call.model_validate(call) for call in calls])
        return {
            **record,
            **row,
            "calls": [_summarised(call) for call in calls],
            "capture_gap": gap and {**dataclasses.asdict(gap), "served": gap.served, "note": gap.note},
            "rewards": [json.loads(r["body"]) for r in rewards],
            "attempts": attempts,
        }

    def tasks(self, *, sort: str = "last", descending: bool = True, limit: int = 50, offset: int = 0) -> dict[str, Any]:
        """Tasks with their number of rollouts and groups and their mean reward, one page."""
        order = "DESC" if descending else "ASC"
        rows = self._all(
            "SELECT task_id, COUNT(*) AS n, COUNT(DISTINCT group_id) AS groups, AVG(final_reward) AS mean_reward, "
            f"SUM(status IN {FAILED}) AS failed, MAX(seq) AS last_seq FROM rollouts GROUP BY task_id "
            f"ORDER BY {TASK_SORTS[sort]} {order} LIMIT ? OFFSET ?",
            limit,
            offset,
        )
        total = self._all("SELECT COUNT(DISTINCT task_id) AS n FROM rollouts")[0]["n"]
        return {"rows": rows, "total": total, "limit": limit, "offset": offset}

    def task_groups(self, task_id: str, limit: int = 50, offset: int = 0) -> dict[str, Any]:
        """A task's payload and its groups (newest first, one page), each with its rollouts' rewards and answers."""
        groups = self._all(
            "SELECT group_id, MIN(seq) AS first FROM rollouts WHERE task_id=? GROUP BY group_id "
            "ORDER BY first DESC LIMIT ? OFFSET ?",
            task_id,
            limit,
            offset,
        )
        if not groups and offset == 0:
            raise NotFound(f"unknown task {task_id!r}")
        rows = self._all(
            "SELECT rollout_id, group_id, status, final_reward, model_version, attempt, (SELECT "
            "json_extract(body, '$.output.content') FROM calls c WHERE c.rollout_id=r.rollout_id AND c.kind='llm' "
            "ORDER BY sequence DESC LIMIT 1) AS answer FROM rollouts r "
            "WHERE group_id IN (SELECT value FROM json_each(?)) "
            "ORDER BY seq",
            json.dumps([g["group_id"] for g in groups]),
        )
        task = self._all("SELECT task FROM rollouts WHERE task_id=? LIMIT 1", task_id)
        total = self._all("SELECT COUNT(DISTINCT group_id) AS n FROM rollouts WHERE task_id=?", task_id)[0]["n"]
        return {
            "task_id": task_id,
            "task": json.loads(task[0]["task"]) if task else None,
            "total": total,
            "groups": [
                {"group_id": g["group_id"], "rollouts": [r for r in rows if r["group_id"] == g["group_id"]]}
                for g in groups
            ],
        }

    def overview(self) -> dict[str, Any]:
        """Counts by state, retried rollouts, model versions with their rollouts' mean reward, datasets, workers."""
        served = {
            r["model_version"]: r
            for r in self._all(
                "SELECT model_version, COUNT(*) AS rollouts, AVG(final_reward) AS mean_reward FROM rollouts GROUP BY 1"
            )
        }
        versions = self._all("SELECT version, model_name, created FROM model_versions ORDER BY seq")
        return {
            "counts": {r["status"]: r["n"] for r in self._all("SELECT status, COUNT(*) AS n FROM rollouts GROUP BY 1")},
            "retried": self._all("SELECT COUNT(*) AS n FROM rollouts WHERE attempt > 1")[0]["n"],
            "model_versions": [
                {**v, "rollouts": 0, "mean_reward": None, **served.get(v["version"], {})} for v in versions
            ],
            "datasets": self._all("SELECT dataset_id, name, size, created FROM datasets ORDER BY created"),
            "workers": self._all("SELECT * FROM workers ORDER BY first_seen"),
        }

    def batches(self, limit: int = 500) -> list[dict[str, Any]]:
        """The latest batches of rollouts (the group id's prefix: a training step), oldest first, with their mean
        reward and failures: the run's curve when it has no metrics file."""
        rows = self._all(
            "SELECT substr(group_id, 1, instr(group_id, ':') - 1) AS batch, COUNT(*) AS n, "
            f"AVG(final_reward) AS mean_reward, SUM(status IN {FAILED}) AS failed, MIN(seq) AS first "
            "FROM rollouts GROUP BY batch ORDER BY first DESC LIMIT ?",
            limit,
        )
        return rows[::-1]

    def filter_options(self) -> dict[str, list[str]]:
        """Suggestions for the rollout filters: every model version, and the roles of the latest rollouts."""
        return {
            "model_versions": [r["version"] for r in self._all("SELECT DISTINCT version FROM model_versions")],
            "roles": [
                r["role"]
                for r in self._all(
                    "SELECT DISTINCT role FROM calls WHERE rollout_id IN (SELECT rollout_id FROM rollouts "
                    "ORDER BY seq DESC LIMIT 500) AND role IS NOT NULL ORDER BY role"
                )
            ],
        }


def _summarised(call: dict[str, Any]) -> dict[str, Any]:
    """A call without its token id lists: their lengths (and the mean sampling logprob) instead."""
    ids = {name: call.pop(name, None) for name in _TOKEN_FIELDS}
    logprobs = ids["completion_logprobs"]
    call["prompt_tokens"] = None if ids["prompt_token_ids"] is None else len(ids["prompt_token_ids"])
    call["completion_tokens"] = None if ids["completion_token_ids"] is None else len(ids["completion_token_ids"])
    call["mean_logprob"] = sum(logprobs) / len(logprobs) if logprobs else None
    return call
