"""The store's SQLite file: its tables, how it is opened (WAL, one connection shared under a lock), whether it can
still be written; and records as it keeps them: JSON text of task payloads (finite numbers only), task ids checked for
collisions, stored call records read back, and the calls a client captured (roles, tools, rewards) joined with those
the proxy recorded for the same rollout (exact token ids): matched by response id, then in order; unclaimed proxy
calls are added by start time."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from agentlightning.errors import StoreError, StoreUnavailable
from agentlightning.types import MISSED_BY_CAPTURE, Call, merge_records

logger = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS datasets(
    dataset_id TEXT PRIMARY KEY, name TEXT, size INTEGER NOT NULL, created REAL NOT NULL, digest TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tasks(
    dataset_id TEXT NOT NULL, idx INTEGER NOT NULL, task_id TEXT NOT NULL, payload TEXT NOT NULL,
    PRIMARY KEY (dataset_id, idx));
CREATE TABLE IF NOT EXISTS rollouts(
    seq INTEGER PRIMARY KEY AUTOINCREMENT, rollout_id TEXT UNIQUE NOT NULL, task_id TEXT, dataset_id TEXT,
    group_id TEXT, task TEXT, status TEXT NOT NULL, attempt INTEGER NOT NULL, max_attempts INTEGER NOT NULL,
    timeout REAL, worker_id TEXT, lease_expires REAL, created REAL NOT NULL, started REAL, ended REAL,
    final_reward REAL, model_version TEXT, n_calls INTEGER, record TEXT,
    not_before REAL);  -- when it may be leased: queued rollouts are leased in this order
CREATE INDEX IF NOT EXISTS rollouts_by_status ON rollouts(status, seq);
CREATE INDEX IF NOT EXISTS rollouts_by_queue ON rollouts(status, not_before, seq);
CREATE INDEX IF NOT EXISTS rollouts_by_lease ON rollouts(status, lease_expires);
CREATE INDEX IF NOT EXISTS rollouts_by_group ON rollouts(group_id);
CREATE INDEX IF NOT EXISTS rollouts_by_task ON rollouts(task_id);
CREATE INDEX IF NOT EXISTS rollouts_by_version ON rollouts(model_version, seq);
CREATE INDEX IF NOT EXISTS rollouts_by_reward ON rollouts(final_reward, seq);
CREATE TABLE IF NOT EXISTS attempts(
    rollout_id TEXT NOT NULL, attempt INTEGER NOT NULL, worker_id TEXT, status TEXT NOT NULL,
    started REAL, ended REAL, error TEXT, logs TEXT,
    handed_rollout TEXT, handed_attempt INTEGER,  -- the lease answered with this attempt's result, for a re-send
    PRIMARY KEY (rollout_id, attempt));
CREATE TABLE IF NOT EXISTS calls(
    rollout_id TEXT NOT NULL, sequence INTEGER NOT NULL, call_id TEXT NOT NULL, kind TEXT, role TEXT,
    body TEXT NOT NULL, PRIMARY KEY (rollout_id, sequence));
CREATE INDEX IF NOT EXISTS calls_by_role ON calls(role, rollout_id);
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


def open_database(path: str) -> sqlite3.Connection:
    """The store file at ``path`` (``":memory:"`` for throwaway use; its directory must exist), created if needed,
    in WAL mode, with rows readable by column name. Transactions are explicit (``BEGIN IMMEDIATE``); the caller
    serialises access."""
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    db.row_factory = sqlite3.Row
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("PRAGMA busy_timeout=10000")
    columns = {row[1] for row in db.execute("PRAGMA table_info(rollouts)")}
    if columns and "not_before" not in columns:  # a store from before re-lease delays
        db.execute("ALTER TABLE rollouts ADD COLUMN not_before REAL")
        db.execute("UPDATE rollouts SET not_before=created")
    attempt_columns = {row[1] for row in db.execute("PRAGMA table_info(attempts)")}
    if attempt_columns and "handed_rollout" not in attempt_columns:  # a store from before re-sends were remembered
        db.execute("ALTER TABLE attempts ADD COLUMN handed_rollout TEXT")
        db.execute("ALTER TABLE attempts ADD COLUMN handed_attempt INTEGER")
    db.executescript(SCHEMA)
    return db


def file_identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of the store file, None for ``":memory:"``."""
    if path == ":memory:":
        return None
    stat = os.stat(path)
    return stat.st_dev, stat.st_ino


def check_writable(path: str, identity: tuple[int, int] | None) -> None:
    """Raise :class:`StoreUnavailable` if the file opened as ``identity`` was deleted or replaced (writes would go into
    a file nobody reads again), or it or its directory became read-only."""
    if identity is None:
        return
    if not os.path.exists(path) or file_identity(path) != identity:
        raise StoreUnavailable(
            f"the store file {path} was deleted or replaced while the server had it open; refusing "
            "work that would be lost (restore the file, or restart the server)"
        )
    if not os.access(path, os.W_OK) or not os.access(os.path.dirname(os.path.abspath(path)), os.W_OK):
        raise StoreUnavailable(f"the store file {path} (or its directory) is not writable")


def json_text_of(value: Any, what: str) -> str:
    """``value`` as JSON text (finite numbers only), or a :class:`StoreError` naming ``what``."""
    try:
        return json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"{what} is not JSON data (finite numbers, strings, lists, objects): {exc}") from None


def check_task_ids(tasks: Sequence[tuple[str, str]]) -> None:
    """Refuse two tasks (task id, payload) with the same id and different content: they would share GRPO groups."""
    first: dict[str, tuple[int, str]] = {}
    for index, (task_id, payload) in enumerate(tasks):
        seen = first.setdefault(task_id, (index, payload))
        if seen[1] != payload:
            raise StoreError(
                f"records {seen[0]} and {index} (0-based) have the same task id {task_id!r} but different "
                "content: GRPO groups are formed per task id, so give each task its own id"
            )


def calls_from_json(bodies: Iterable[str], rollout_id: str) -> list[Call]:
    """Stored proxy records as calls; a record that is not a valid call is skipped with a warning (one bad upstream
    answer must not make its rollout's result unstorable)."""
    calls: list[Call] = []
    for body in bodies:
        try:
            calls.append(Call.model_validate_json(body))
        except ValidationError as exc:
            logger.warning("rollout %s: skipping an invalid proxy call record: %s", rollout_id, exc)
    return calls


def join_calls(rollout_id: str, client_calls: list[Call], proxy_calls: list[Call]) -> list[Call]:
    """Merge ``proxy_calls`` (in proxy order) into ``client_calls``; returns the calls renumbered in order. A client
    call already joined (``metadata["proxy_call_id"]``) is not matched again."""
    calls = sorted(client_calls, key=lambda call: call.sequence)
    remaining = list(proxy_calls)
    by_response = {call.response_id: call for call in remaining if call.response_id}
    unmatched: list[Call] = []
    for call in calls:
        if call.kind != "llm" or "proxy_call_id" in call.metadata:
            continue
        proxy = by_response.pop(call.response_id, None) if call.response_id else None
        if proxy is not None:
            remaining.remove(proxy)
            _merge(call, proxy)
        elif _went_through_proxy(call, rollout_id):
            unmatched.append(call)
    for call in unmatched:
        # Both sides knowing (different) response ids means these are not the same call.
        proxy = next((p for p in remaining if not (p.response_id and call.response_id)), None)
        if proxy is not None:
            remaining.remove(proxy)
            _merge(call, proxy)
    if remaining and len(remaining) < len(proxy_calls):  # capture saw some of the proxy's calls, not all
        for proxy in remaining:
            proxy.metadata[MISSED_BY_CAPTURE] = True
    merged = list(calls)
    for proxy in sorted(remaining, key=lambda call: call.start_time):  # calls of their own, placed by start time
        position = next((i for i, call in enumerate(merged) if call.start_time > proxy.start_time), len(merged))
        merged.insert(position, proxy)
    for sequence, call in enumerate(merged):
        call.sequence = sequence
        call.rollout_id = rollout_id
    return merged


@dataclass(frozen=True)
class CaptureGap:
    """LLM calls of a rollout that the proxy served and in-process capture missed while it recorded others."""

    captured: int  # LLM calls both capture and the proxy recorded
    missed: int  # calls only the proxy recorded (marked :data:`MISSED_BY_CAPTURE`)
    endpoints: tuple[str, ...]  # the missed calls' endpoints

    @property
    def served(self) -> int:
        return self.captured + self.missed

    @property
    def note(self) -> str:
        """What to tell the user: the counts, the likely cause and the fix."""
        return (
            f"the proxy served {self.served} LLM calls but in-process capture recorded only {self.captured}; "
            f"the {self.missed} missed ({', '.join(self.endpoints)}) are kept from the proxy's records, without roles "
            "or tool calls. Likely cause: a framework or client that Agent Lightning does not instrument, or one that "
            "sends requests around the patched openai/httpx path (its own HTTP client, a raw POST). Enable or install "
            "the adapter for that framework (agl.instrument('<name>'), pip install 'agentlightning[<name>]'), or name "
            "the calls' roles yourself; see docs/capture.md."
        )


def capture_gap(calls: Sequence[Call]) -> CaptureGap | None:
    """The capture gap of a rollout's joined calls (those :func:`join_calls` marked :data:`MISSED_BY_CAPTURE`); None
    when capture missed none."""
    missed = [call for call in calls if call.metadata.get(MISSED_BY_CAPTURE)]
    if not missed:
        return None
    return CaptureGap(
        captured=sum(1 for call in calls if call.kind == "llm" and "proxy_call_id" in call.metadata),
        missed=len(missed),
        endpoints=tuple(sorted({str(call.metadata.get("endpoint") or call.name or "?") for call in missed})),
    )


def join_late_call(rollout_id: str, stored_calls: list[Call], proxy: Call) -> list[Call]:
    """Join a proxy call that landed after the rollout's result was stored (e.g. in flight at the timeout) with the
    rollout's stored calls; the call it became or joined is marked ``metadata["late"] = True``."""
    calls = join_calls(rollout_id, stored_calls, [proxy])
    for call in calls:
        if call.call_id == proxy.call_id or call.metadata.get("proxy_call_id") == proxy.call_id:
            call.metadata["late"] = True
    return calls


def _merge(call: Call, proxy: Call) -> None:
    merge_records(call, proxy)
    call.metadata["proxy_call_id"] = proxy.call_id


def _went_through_proxy(call: Call, rollout_id: str) -> bool:
    """Whether a client call could have been served by this rollout's proxy (unknown endpoints count)."""
    endpoint = call.metadata.get("base_url") or call.metadata.get("endpoint")
    return not isinstance(endpoint, str) or "://" not in endpoint or f"/rollouts/{rollout_id}/" in endpoint + "/"
