"""Hand-checked cases for the RAG reward (0.9 x SQuAD F1 + 0.1 x format) and the BM25 retrieval."""

from __future__ import annotations

from pathlib import Path

import pytest

from examples.rag.retrieval import BM25Index, Passage, index_for
from examples.rag.reward import GoldAnswerError, extract_answer, f1_score, normalize_answer, score


@pytest.mark.parametrize(
    ("text", "normalised"),
    [
        ("The Eiffel Tower!", "eiffel tower"),
        ("  an   Apple, a day ", "apple day"),
        ("U.S.A.", "usa"),
        ("Theatre of the Absurd", "theatre of absurd"),
        ("", ""),
    ],
)
def test_normalize_answer(text: str, normalised: str) -> None:
    assert normalize_answer(text) == normalised


def test_f1_hand_computed() -> None:
    assert f1_score("the Eiffel Tower", "Eiffel tower.") == 1.0
    # prediction "paris france" vs gold "paris": precision 1/2, recall 1 -> F1 2/3
    assert f1_score("Paris, France", "Paris") == pytest.approx(2 / 3)
    # prediction "new york city" vs gold "york city council": overlap 2, P 2/3, R 2/3 -> 2/3
    assert f1_score("New York City", "York City Council") == pytest.approx(2 / 3)
    # duplicates count once per occurrence: "the the cat" -> "cat" after normalisation
    assert f1_score("the the cat", "cat") == 1.0
    assert f1_score("a a a", "b") == 0.0
    assert f1_score("dog dog", "dog") == pytest.approx(2 * 0.5 * 1 / 1.5)


def test_gold_answer_in_tags_scores_one() -> None:
    result = score("<answer>Audrey Hepburn</answer>", "Audrey Hepburn")
    assert (result.reward, result.f1, result.format_ok, result.answer) == (1.0, 1.0, True, "Audrey Hepburn")


def test_wrong_answer_in_tags_scores_format_only() -> None:
    result = score("I looked it up.\n<answer>Julie Andrews</answer>", "Audrey Hepburn")
    assert result.reward == pytest.approx(0.1) and result.f1 == 0.0 and result.format_ok


def test_partial_answer_scores_weighted_f1() -> None:
    result = score("<answer>Hepburn</answer>", "Audrey Hepburn")  # P 1, R 1/2 -> F1 2/3
    assert result.reward == pytest.approx(0.9 * 2 / 3 + 0.1)


def test_aliases_take_the_best_f1() -> None:
    assert score("<answer>lead</answer>", "for Best Performance", ["leading role", "lead"]).reward == 1.0


@pytest.mark.parametrize(
    "reply",
    [
        "Audrey Hepburn",  # no tags
        "<answer></answer>",  # empty
        "<answer>Audrey</answer> <answer>Hepburn</answer>",  # two spans
        "<answer>Audrey Hepburn",  # unclosed
    ],
)
def test_missing_or_malformed_format_scores_zero(reply: str) -> None:
    result = score(reply, "Audrey Hepburn")
    assert (result.reward, result.format_ok) == (0.0, False)


def test_answer_tags_are_case_insensitive_and_multiline() -> None:
    assert extract_answer("<ANSWER>\n  1975\n</ANSWER>") == "1975"


@pytest.mark.parametrize("gold", ["", "  ", "the", None, 42])
def test_unusable_gold_answer_is_a_clear_error(gold: object) -> None:
    with pytest.raises(GoldAnswerError, match="gold answer must be a non-empty string"):
        score("<answer>x</answer>", gold)  # type: ignore[arg-type]


def test_non_string_reply_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="reply must be a string, got NoneType"):
        score(None, "x")  # type: ignore[arg-type]


def test_bm25_ranks_the_matching_passage_first() -> None:
    index = BM25Index(
        [
            Passage("Paris", "Paris is the capital of France."),
            Passage("Berlin", "Berlin is the capital of Germany."),
            Passage("Rome", "Rome is the capital of Italy."),
            Passage("Madrid", "Madrid is the capital of Spain."),
            Passage("Lisbon", "Lisbon is the capital of Portugal."),
            Passage("Paris", "Paris is the capital of France."),  # duplicate removed
        ]
    )
    assert len(index.passages) == 5
    assert [p.title for p in index.search("capital of Germany", k=1)] == ["Berlin"]
    assert index.search("the of", k=3) == []  # only stop words
    assert index.search("zebra", k=3) == []  # no passage scores above zero


def test_bm25_over_the_real_corpus(data_dir: Path) -> None:
    index = index_for(str(data_dir))
    assert len(index.passages) > 4000
    top = index.search("Who portrayed Lettie Lutz in The Greatest Showman?", k=3)
    assert any("Keala Settle" in passage.render() for passage in top)
