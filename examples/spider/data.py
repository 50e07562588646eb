"""Spider dev data: the usable questions (their database exists), the database schemas, and a train/validation
split by database so that validation databases are never seen in training."""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import Any

from examples.common import data_file
from examples.spider.reward import DatabaseNotFoundError

logger = logging.getLogger(__name__)

VALIDATION_FRACTION = 0.2
SPLIT_SALT = "agentlightning-spider-split-v1"


def database_path(data_dir: Path, db_id: str) -> Path:
    """Where the SQLite file of ``db_id`` lives under ``data_dir``."""
    return Path(data_dir) / "spider" / "database" / db_id / f"{db_id}.sqlite"


def load_questions(data_dir: Path) -> list[dict[str, Any]]:
    """The Spider dev questions whose database exists, as JSON-serialisable tasks.

    Each task has ``task_id`` (``spider-dev-NNNN``, the index in dev.json), ``question``, ``db_id``,
    ``db_path`` (absolute) and ``gold_sql``. Questions whose database is missing are skipped with one log line
    per database.
    """
    data_dir = Path(data_dir).resolve()
    questions = json.loads(data_file(data_dir, "spider/dev.json").read_text(encoding="utf-8"))
    tasks: list[dict[str, Any]] = []
    missing: Counter[str] = Counter()
    for index, row in enumerate(questions):
        for key in ("db_id", "question", "query"):
            if not isinstance(row.get(key), str) or not row[key].strip():
                raise ValueError(f"spider/dev.json entry {index}: field {key!r} missing or empty: {row.get(key)!r}")
        path = database_path(data_dir, row["db_id"])
        if not path.is_file():
            missing[row["db_id"]] += 1
            continue
        tasks.append(
            {
                "task_id": f"spider-dev-{index:04d}",
                "question": row["question"],
                "db_id": row["db_id"],
                "db_path": str(path),
                "gold_sql": row["query"],
            }
        )
    for db_id, count in sorted(missing.items()):
        logger.info("skipping %d Spider questions: database %r not found under %s", count, db_id, data_dir)
    return tasks


def split_by_database(
    tasks: list[dict[str, Any]], validation_fraction: float = VALIDATION_FRACTION
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Deterministic (train, validation) split where no database appears in both.

    Databases are ordered by a salted hash of their id and moved to validation until it holds at least
    ``validation_fraction`` of the questions.
    """
    if not 0.0 < validation_fraction < 1.0:
        raise ValueError(f"validation_fraction must be in (0, 1), got {validation_fraction!r}")
    sizes = Counter(task["db_id"] for task in tasks)
    order = sorted(sizes, key=lambda db: hashlib.sha256(f"{SPLIT_SALT}:{db}".encode()).hexdigest())
    target = validation_fraction * len(tasks)
    validation_dbs: set[str] = set()
    count = 0
    for db_id in order:
        if count >= target or len(validation_dbs) == len(sizes) - 1:
            break
        validation_dbs.add(db_id)
        count += sizes[db_id]
    train = [task for task in tasks if task["db_id"] not in validation_dbs]
    validation = [task for task in tasks if task["db_id"] in validation_dbs]
    return train, validation


@lru_cache(maxsize=64)
def schema_text(db_path: str) -> str:
    """The CREATE TABLE statements of a database, one per table, whitespace compacted."""
    path = Path(db_path)
    if not path.is_file():
        raise DatabaseNotFoundError(f"SQLite database {db_path!r} does not exist")
    connection = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)
    try:
        statements = connection.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND sql IS NOT NULL ORDER BY rowid"
        ).fetchall()
    finally:
        connection.close()
    return "\n\n".join(" ".join(sql.split()) for (sql,) in statements)
