"""Spider's reward: execution-result match of the predicted SQL against the gold SQL on the SQLite database.

Comparison rules (hand-checked in ``tests/examples/test_spider_reward.py``):

- rows are compared as a multiset (duplicates count) unless the gold query has a top-level ``ORDER BY``, in which
  case the row order must match too;
- column order is ignored, as in the Spider test-suite evaluation: the prediction matches when some permutation of
  its columns gives the gold result (``SELECT name, age`` answers the same question as ``SELECT age, name``);
- values compare with Python equality (``1 == 1.0``); two empty results match;
- a predicted query that fails (syntax error, unknown column, several statements, a write, a timeout, too many rows)
  gets reward 0 and the error is returned in :class:`ExecutionMatch`;
- a gold query that fails, or a missing database, raises: that is a problem with the data, not with the model.
"""

from __future__ import annotations

import sqlite3
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise, product
from pathlib import Path
from typing import Any

Row = tuple[Any, ...]

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MAX_ROWS = 100_000


class GoldQueryError(ValueError):
    """The gold SQL of a task does not execute on its database."""


class DatabaseNotFoundError(FileNotFoundError):
    """The SQLite file of a task is missing."""


class QueryError(RuntimeError):
    """A query failed to execute (SQL error, timeout, result too large)."""


@dataclass(frozen=True)
class ExecutionMatch:
    """Outcome of comparing a predicted query with the gold query."""

    reward: float
    error: str | None = None
    predicted_rows: int | None = None
    gold_rows: int = 0
    ordered: bool = False


def run_query(
    db_path: str | Path, sql: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, max_rows: int = DEFAULT_MAX_ROWS
) -> list[Row]:
    """Execute one read-only query and return its rows.

    Raises :class:`DatabaseNotFoundError` if the file is missing and :class:`QueryError` for anything the query
    itself does wrong (including running longer than ``timeout_s`` or returning more than ``max_rows`` rows).
    """
    path = Path(db_path)
    if not path.is_file():
        raise DatabaseNotFoundError(f"SQLite database {str(path)!r} does not exist")
    connection = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True, check_same_thread=False)
    # Spider has a few non-UTF-8 strings; never fail on decoding.
    connection.text_factory = lambda raw: raw.decode("utf-8", errors="replace")
    deadline = time.monotonic() + timeout_s
    connection.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
    try:
        cursor = connection.execute(sql)
        rows = cursor.fetchmany(max_rows + 1)
    except (sqlite3.Error, sqlite3.Warning) as exc:
        message = str(exc)
        if message == "interrupted":
            message = f"query did not finish within {timeout_s} s"
        raise QueryError(f"{type(exc).__name__}: {message}") from None
    finally:
        connection.close()
    if len(rows) > max_rows:
        raise QueryError(f"query returned more than {max_rows} rows")
    return [tuple(row) for row in rows]


def has_top_level_order_by(sql: str) -> bool:
    """Whether ``sql`` sorts its final result (an ``ORDER BY`` outside parentheses and string literals)."""
    depth = 0
    quote: str | None = None
    words: list[str] = []
    word = ""
    for char in sql:
        if quote is not None:
            if char == quote:
                quote = None
            continue
        if char in "'\"`":
            quote = char
        elif char == "(":
            depth += 1
        elif char == ")":
            depth = max(0, depth - 1)
        if depth == 0 and quote is None and (char.isalnum() or char == "_"):
            word += char.lower()
            continue
        if word:
            words.append(word)
            word = ""
        if depth > 0 or quote is not None:
            words.append("")  # a subquery or literal separates "order" from a later "by"
    if word:
        words.append(word)
    return any(first == "order" and second == "by" for first, second in pairwise(words))


def results_match(predicted: Sequence[Row], gold: Sequence[Row], *, ordered: bool) -> bool:
    """Whether two query results are the same answer (see the module docstring for the rules)."""
    if len(predicted) != len(gold):
        return False
    if not gold:
        return True
    width = len(gold[0])
    if any(len(row) != width for row in predicted):
        return False
    gold_counter = None if ordered else Counter(gold)
    for permutation in _column_permutations(predicted, gold, width):
        permuted = [tuple(row[index] for index in permutation) for row in predicted]
        if ordered:
            if permuted == list(gold):
                return True
        elif Counter(permuted) == gold_counter:
            return True
    return False


def _column_permutations(predicted: Sequence[Row], gold: Sequence[Row], width: int) -> Iterator[tuple[int, ...]]:
    """Column orders of ``predicted`` worth trying: gold column j may only come from a predicted column holding
    the same multiset of values."""
    predicted_columns = [Counter(row[i] for row in predicted) for i in range(width)]
    gold_columns = [Counter(row[j] for row in gold) for j in range(width)]
    candidates = [[i for i in range(width) if predicted_columns[i] == gold_columns[j]] for j in range(width)]
    if any(not options for options in candidates):
        return
    if all(len(options) == 1 for options in candidates):
        permutation = tuple(options[0] for options in candidates)
        if len(set(permutation)) == width:
            yield permutation
        return
    for permutation in product(*candidates):
        if len(set(permutation)) == width:
            yield permutation


def execution_match(
    predicted_sql: str,
    gold_sql: str,
    db_path: str | Path,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_rows: int = DEFAULT_MAX_ROWS,
) -> ExecutionMatch:
    """Reward 1.0 when ``predicted_sql`` returns the same result as ``gold_sql`` on ``db_path``, else 0.0."""
    if not isinstance(predicted_sql, str):
        raise TypeError(f"predicted SQL must be a string, got {type(predicted_sql).__name__} {predicted_sql!r}")
    if not isinstance(gold_sql, str) or not gold_sql.strip():
        raise GoldQueryError(f"gold SQL must be a non-empty string, got {gold_sql!r} (database {str(db_path)!r})")
    try:
        gold_rows = run_query(db_path, gold_sql, timeout_s=timeout_s, max_rows=max_rows)
    except QueryError as exc:
        raise GoldQueryError(f"gold SQL {gold_sql!r} fails on {str(db_path)!r}: {exc}") from None
    ordered = has_top_level_order_by(gold_sql)
    if not predicted_sql.strip():
        return ExecutionMatch(0.0, error="empty SQL", gold_rows=len(gold_rows), ordered=ordered)
    try:
        predicted_rows = run_query(db_path, predicted_sql, timeout_s=timeout_s, max_rows=max_rows)
    except QueryError as exc:
        return ExecutionMatch(0.0, error=str(exc), gold_rows=len(gold_rows), ordered=ordered)
    matched = results_match(predicted_rows, gold_rows, ordered=ordered)
    return ExecutionMatch(
        1.0 if matched else 0.0, predicted_rows=len(predicted_rows), gold_rows=len(gold_rows), ordered=ordered
    )
