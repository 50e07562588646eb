"""Hand-checked cases for Spider's execution-match reward."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from examples.spider.reward import (
    DatabaseNotFoundError,
    GoldQueryError,
    execution_match,
    has_top_level_order_by,
    results_match,
    run_query,
)


@pytest.fixture()
def db(tmp_path: Path) -> str:
    path = tmp_path / "pets.sqlite"
    connection = sqlite3.connect(path)
    connection.executescript(
        """
        CREATE TABLE pet (id INTEGER PRIMARY KEY, name TEXT, kind TEXT, age INTEGER, weight REAL);
        INSERT INTO pet VALUES (1, 'Rex', 'dog', 3, 12.5), (2, 'Tom', 'cat', 5, 4.0), (3, 'Fido', 'dog', 3, 20.0),
                               (4, 'Kit', 'cat', 1, 3.5);
        """
    )
    connection.commit()
    connection.close()
    return str(path)


def test_identical_query_scores_one(db: str) -> None:
    match = execution_match("SELECT name FROM pet WHERE kind = 'dog'", "SELECT name FROM pet WHERE kind = 'dog'", db)
    assert (match.reward, match.error, match.predicted_rows, match.gold_rows) == (1.0, None, 2, 2)


def test_different_sql_same_result_scores_one(db: str) -> None:
    match = execution_match("select name from pet where age = 3", "SELECT name FROM pet WHERE kind = 'dog'", db)
    assert match.reward == 1.0


def test_wrong_result_scores_zero(db: str) -> None:
    match = execution_match("SELECT name FROM pet WHERE kind = 'cat'", "SELECT name FROM pet WHERE kind = 'dog'", db)
    assert (match.reward, match.error) == (0.0, None)


def test_row_order_ignored_without_order_by(db: str) -> None:
    gold = "SELECT name FROM pet WHERE kind = 'dog'"
    assert execution_match("SELECT name FROM pet WHERE kind = 'dog' ORDER BY name DESC", gold, db).reward == 1.0
    assert execution_match("SELECT name FROM pet WHERE kind = 'dog' ORDER BY name ASC", gold, db).reward == 1.0


def test_row_order_matters_with_gold_order_by(db: str) -> None:
    gold = "SELECT name FROM pet ORDER BY age DESC, name"
    assert execution_match("SELECT name FROM pet ORDER BY age DESC, name ASC", gold, db).reward == 1.0
    match = execution_match("SELECT name FROM pet ORDER BY age ASC, name", gold, db)
    assert (match.reward, match.ordered) == (0.0, True)
    assert execution_match("SELECT name FROM pet", gold, db).reward == 0.0


def test_order_by_inside_subquery_does_not_make_result_ordered(db: str) -> None:
    gold = "SELECT name FROM pet WHERE age = (SELECT age FROM pet ORDER BY age DESC LIMIT 1) OR kind = 'dog'"
    assert not has_top_level_order_by(gold)
    assert execution_match("SELECT name FROM pet WHERE name != 'Kit' ORDER BY name", gold, db).reward == 1.0


def test_duplicates_follow_multiset_semantics(db: str) -> None:
    gold = "SELECT kind FROM pet"  # dog, cat, dog, cat
    assert execution_match("SELECT DISTINCT kind FROM pet", gold, db).reward == 0.0
    assert execution_match("SELECT kind FROM pet ORDER BY kind", gold, db).reward == 1.0
    # same distinct values, same row count, different multiplicities: dog x3 + cat x1 is not dog x2 + cat x2
    assert execution_match("SELECT CASE WHEN id = 2 THEN 'dog' ELSE kind END FROM pet", gold, db).reward == 0.0


def test_column_order_is_ignored(db: str) -> None:
    assert execution_match("SELECT age, name FROM pet", "SELECT name, age FROM pet", db).reward == 1.0
    assert execution_match("SELECT name FROM pet", "SELECT name, age FROM pet", db).reward == 0.0
    assert execution_match("SELECT name, age, kind FROM pet", "SELECT name, age FROM pet", db).reward == 0.0


def test_column_permutation_must_keep_rows_together(db: str) -> None:
    # Same values per column, but paired differently across rows: not the same answer.
    gold = "SELECT name, age FROM pet WHERE kind = 'dog'"  # (Rex, 3), (Fido, 3)
    assert execution_match("SELECT name, 3 FROM pet WHERE kind = 'dog'", gold, db).reward == 1.0
    assert results_match([("a", 1), ("b", 2)], [("a", 2), ("b", 1)], ordered=False) is False
    assert results_match([(1, "a"), (2, "b")], [("a", 1), ("b", 2)], ordered=True) is True


def test_int_and_float_values_compare_equal() -> None:
    assert results_match([(1.0,)], [(1,)], ordered=False)
    assert not results_match([(1.5,)], [(1,)], ordered=False)
    assert not results_match([("1",)], [(1,)], ordered=False)


def test_empty_results_match(db: str) -> None:
    assert execution_match("SELECT name FROM pet WHERE age > 100", "SELECT id FROM pet WHERE age < 0", db).reward == 1.0


@pytest.mark.parametrize(
    ("predicted", "fragment"),
    [
        ("SELEC name FROM pet", "syntax error"),
        ("SELECT nme FROM pet", "no such column: nme"),
        ("SELECT name FROM pets", "no such table: pets"),
        ("SELECT 1; SELECT 2", "one statement at a time"),
        ("DELETE FROM pet", "readonly"),
        ("   ", "empty SQL"),
    ],
)
def test_malformed_predicted_sql_scores_zero_with_error(db: str, predicted: str, fragment: str) -> None:
    match = execution_match(predicted, "SELECT name FROM pet", db)
    assert match.reward == 0.0
    assert match.error is not None and fragment in match.error
    assert run_query(db, "SELECT count(*) FROM pet") == [(4,)]  # nothing was written


def test_runaway_query_times_out_with_zero_reward(db: str) -> None:
    runaway = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
    match = execution_match(runaway, "SELECT 1", db, timeout_s=0.2)
    assert match.reward == 0.0 and "did not finish within 0.2 s" in (match.error or "")


def test_too_many_rows_scores_zero(db: str) -> None:
    match = execution_match("SELECT * FROM pet a, pet b", "SELECT 1", db, max_rows=10)
    assert match.reward == 0.0 and "more than 10 rows" in (match.error or "")


def test_malformed_gold_is_a_clear_error(db: str) -> None:
    with pytest.raises(GoldQueryError, match=r"gold SQL 'SELECT nope FROM pet' fails on .*pets.sqlite.*no such column"):
        execution_match("SELECT name FROM pet", "SELECT nope FROM pet", db)
    with pytest.raises(GoldQueryError, match="non-empty string"):
        execution_match("SELECT name FROM pet", "", db)


def test_missing_database_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "wta_1" / "wta_1.sqlite"
    with pytest.raises(DatabaseNotFoundError, match=r"wta_1\.sqlite.* does not exist"):
        execution_match("SELECT 1", "SELECT 1", missing)


def test_non_string_prediction_is_a_type_error(db: str) -> None:
    with pytest.raises(TypeError, match="predicted SQL must be a string, got NoneType"):
        execution_match(None, "SELECT 1", db)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("sql", "ordered"),
    [
        ("SELECT a FROM t ORDER BY a", True),
        ("select a from t order\n  by a desc limit 3", True),
        ("SELECT a FROM t WHERE b = 'order by'", False),
        ('SELECT "order" FROM t', False),
        ("SELECT a FROM (SELECT a FROM t ORDER BY a) AS s", False),
        ("SELECT a FROM t WHERE a IN (SELECT a FROM u ORDER BY a LIMIT 1) ORDER BY a", True),
        ("SELECT border, by_x FROM t", False),
    ],
)
def test_top_level_order_by_detection(sql: str, ordered: bool) -> None:
    assert has_top_level_order_by(sql) is ordered


def test_real_spider_gold_queries(data_dir: Path) -> None:
    db = str(data_dir / "spider" / "database" / "concert_singer" / "concert_singer.sqlite")
    gold = "SELECT name ,  country ,  age FROM singer ORDER BY age DESC"
    assert execution_match("SELECT Name, Country, Age FROM singer ORDER BY Age DESC", gold, db).reward == 1.0
    assert execution_match("SELECT age, name, country FROM singer ORDER BY age DESC", gold, db).reward == 1.0
    assert execution_match("SELECT name, country, age FROM singer ORDER BY age ASC", gold, db).reward == 0.0
    assert execution_match("SELECT count(*) FROM singer", "SELECT count(*) FROM singer", db).reward == 1.0
