"""Hand-checked cases for the Calc-X answer matching and the safe calculator."""

from __future__ import annotations

from fractions import Fraction

import pytest

from examples.calc_x.calculator import CalculatorError, calculate, evaluate
from examples.calc_x.reward import GoldAnswerError, extract_answer, parse_number, score


@pytest.mark.parametrize(
    ("reply", "gold"),
    [
        ("### ANSWER: 18 ###", 18),
        ("### ANSWER: 18 ###", "18"),
        ("### ANSWER: $18 ###", "18"),
        ("### ANSWER: $18.00 ###", 18.0),
        ("### ANSWER: 18.0 ###", "18"),
        ("### ANSWER: 1,234 ###", "1234"),
        ("### ANSWER: 1234 ###", "1,234"),
        ("### ANSWER: 2/3 ###", "2/3"),
        ("### ANSWER: 0.6667 ###", "2/3"),
        ("### ANSWER: \\frac{2}{3} ###", "2/3"),
        ("### ANSWER: 1 1/2 ###", 1.5),
        ("### ANSWER: 12 apples ###", "12"),
        ("### ANSWER: 50% ###", "50"),
        ("### ANSWER: -3 ###", "-3"),
        ("### ANSWER: C ###", "C"),
        ("### ANSWER: (c) 6 days ###", "C"),
        ("so the total is \\boxed{42}", "42"),
        ("She pays 5 + 13 = 18 dollars.", "18"),
        ("### ANSWER: 7 ### wait, no. ### ANSWER: 18 ###", "18"),
    ],
)
def test_right_answers_in_any_format_score_one(reply: str, gold: object) -> None:
    assert score(reply, gold) == 1.0


@pytest.mark.parametrize(
    ("reply", "gold"),
    [
        ("### ANSWER: 17 ###", "18"),
        ("### ANSWER: 0.67 ###", "2/3"),
        ("### ANSWER: 180 ###", "18"),
        ("### ANSWER: 1.8 ###", "18"),
        ("### ANSWER: D ###", "C"),
        ("### ANSWER: 6 ###", "C"),
        ("### ANSWER: eighteen ###", "18"),
        ("I don't know", "18"),
        ("", "18"),
        ("### ANSWER: 18 ### then 19", "19"),
    ],
)
def test_wrong_or_unparseable_answers_score_zero(reply: str, gold: object) -> None:
    assert score(reply, gold) == 0.0


@pytest.mark.parametrize("gold", ["eighteen", "", "F", None, True, float("nan"), [18]])
def test_malformed_gold_is_a_clear_error(gold: object) -> None:
    with pytest.raises(GoldAnswerError, match="gold answer"):
        score("### ANSWER: 18 ###", gold)


def test_extract_answer_prefers_the_marker() -> None:
    assert extract_answer("3 + 4 = 7. ### ANSWER: 7 ###") == "7"
    assert extract_answer("no numbers here") is None
    with pytest.raises(TypeError, match="reply must be a string"):
        extract_answer(None)  # type: ignore[arg-type]


def test_parse_number_is_exact() -> None:
    assert parse_number("$1,234.50") == Fraction(246900, 200)
    assert parse_number("2/3") == Fraction(2, 3)
    assert parse_number("-1 1/2") == Fraction(-3, 2)
    assert parse_number("1/0") is None
    assert parse_number("about 5") is None


@pytest.mark.parametrize(
    ("expression", "result"),
    [
        ("16 - 3 - 4", "9"),
        ("9 * 2", "18"),
        ("0.1 + 0.2", "0.3"),
        ("1 / (3/2)", "2/3 = around 0.666667"),
        ("7 / 2", "3.5"),
        ("2^10", "1024"),
        ("1,234 + 1", "1235"),
        ("$12 * 3", "36"),
        ("15% * 200", "30"),
        ("10 % 3", "1"),
        ("max(3, 8) - min(2, 5)", "6"),
        ("sqrt(16)", "4"),
        ("round(2.567, 2)", "2.57"),
        ("-3**2", "-9"),
        ("(2 + 3) * 4", "20"),
    ],
)
def test_calculator_hand_checked(expression: str, result: str) -> None:
    assert calculate(expression) == result


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("1 / 0", "division by zero"),
        ("__import__('os').system('true')", "unknown function"),
        ("__import__('os')", "unknown function '__import__'"),
        ("open('x')", "unknown function 'open'"),
        ("x + 1", "unknown name 'x'"),
        ("(1).__class__", "unsupported syntax"),
        ("[1, 2]", "unsupported syntax"),
        ("'a' * 3", "unsupported literal 'a'"),
        ("10 ** 100000", "exponent 100000 is too large"),
        ("9 ** 9999", "more than 1000 digits"),
        ("(3 + 4", "cannot parse"),
        ("", "empty expression"),
        ("1" * 600, "longer than 500"),
        ("sqrt(-1)", "cannot evaluate"),
    ],
)
def test_calculator_refuses_with_a_reason(expression: str, reason: str) -> None:
    with pytest.raises(CalculatorError, match=reason.replace("(", r"\(").replace("*", r"\*")):
        evaluate(expression)
