"""Calc-X's reward: is the agent's final answer the gold answer, as a number?

The agent ends its reply with ``### ANSWER: <answer> ###`` (the last such marker counts; when there is none, the
reply's last number is taken, so an untidy but right answer still scores). Answers are compared as numbers after
removing formatting: ``$``, thousands commas, spaces, units after the number, a trailing ``.0``, ``%``; fractions
(``2/3``, ``\\frac{2}{3}``, ``1 1/2``) are exact. Two numbers match when equal up to a relative tolerance of
1e-4 (so ``0.6667`` matches ``2/3``, ``0.67`` does not). Multiple-choice gold answers (a single letter A-E, as in
AQuA rows of Calc-X) match the chosen letter.

An unparseable *prediction* scores 0; an unparseable *gold* answer raises :class:`GoldAnswerError`.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

RELATIVE_TOLERANCE = 1e-4

_MARKER = re.compile(r"###\s*ANSWER\s*:\s*(.*?)\s*(?:###|$)", re.IGNORECASE | re.DOTALL)
_BOXED = re.compile(r"\\boxed\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}")
_LATEX_FRACTION = re.compile(r"\\[dt]?frac\{\s*(-?[\d.,]+)\s*\}\{\s*(-?[\d.,]+)\s*\}")
_NUMBER = r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|-?\.\d+"
_MIXED = re.compile(rf"^({_NUMBER})\s+(\d+)\s*/\s*(\d+)$")
_FRACTION = re.compile(rf"^({_NUMBER})\s*/\s*({_NUMBER})$")
_LEADING_NUMBER = re.compile(rf"^({_NUMBER})")
_ANY_NUMBER = re.compile(rf"(?:{_NUMBER})(?:\s*/\s*(?:{_NUMBER}))?")
_CHOICE = re.compile(r"^\(?([A-Ea-e])\)?(?:[).:]|\s|$)")


class GoldAnswerError(ValueError):
    """A task's gold answer is not a number or a choice letter."""


def extract_answer(reply: str) -> str | None:
    """The answer text in a model reply: the last ``### ANSWER: ... ###``, else the last ``\\boxed{...}``, else the
    last number in the reply; None when there is nothing."""
    if not isinstance(reply, str):
        raise TypeError(f"reply must be a string, got {type(reply).__name__} {reply!r}")
    markers = [match.strip() for match in _MARKER.findall(reply) if match.strip()]
    if markers:
        return markers[-1]
    boxed = _BOXED.findall(reply)
    if boxed:
        return boxed[-1].strip()
    numbers = _ANY_NUMBER.findall(reply)
    return numbers[-1] if numbers else None


def parse_number(text: str) -> Fraction | None:
    """The number written in ``text`` (``$1,234.50``, ``18.0``, ``50%``, ``2/3``, ``\\frac{2}{3}``, ``1 1/2``,
    ``12 apples``) as an exact fraction, or None if it does not start with one."""
    cleaned = _LATEX_FRACTION.sub(r"\1/\2", text.strip())
    cleaned = re.sub(r"\\[,!; %$]|\\text\{[^}]*\}|[$€£]", "", cleaned)
    cleaned = cleaned.replace("\u2212", "-").strip().rstrip(".").strip()
    cleaned = re.sub(r"^-\s+", "-", cleaned)
    mixed = _MIXED.match(cleaned)
    if mixed:
        whole, numerator, denominator = _to_number(mixed.group(1)), int(mixed.group(2)), int(mixed.group(3))
        if whole is None or denominator == 0:
            return None
        part = Fraction(numerator, denominator)
        return whole - part if whole < 0 else whole + part
    fraction = _FRACTION.match(cleaned)
    if fraction:
        numerator, denominator = _to_number(fraction.group(1)), _to_number(fraction.group(2))
        if numerator is None or not denominator:
            return None
        return numerator / denominator
    leading = _LEADING_NUMBER.match(cleaned)
    return _to_number(leading.group(1)) if leading else None


def _to_number(text: str) -> Fraction | None:
    try:
        return Fraction(text.replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def parse_gold(gold: object) -> Fraction | str:
    """A gold answer as an exact number, or a choice letter ``A``-``E``; :class:`GoldAnswerError` otherwise."""
    if isinstance(gold, bool) or not isinstance(gold, (int, float, str)):
        raise GoldAnswerError(f"gold answer must be a number or a string, got {type(gold).__name__} {gold!r}")
    if isinstance(gold, float) and not math.isfinite(gold):
        raise GoldAnswerError(f"gold answer {gold!r} is not finite")
    if isinstance(gold, (int, float)):
        return Fraction(repr(gold)) if isinstance(gold, float) else Fraction(gold)
    text = gold.strip()
    if re.fullmatch(r"[A-Ea-e]", text):
        return text.upper()
    value = parse_number(text)
    if value is None or re.search(r"[A-Za-z]", re.sub(r"\\[a-z]+", "", text)):
        raise GoldAnswerError(f"gold answer {gold!r} is not a number, a fraction or a choice letter A-E")
    return value


def numbers_match(predicted: Fraction, gold: Fraction) -> bool:
    """Equal up to a relative tolerance of :data:`RELATIVE_TOLERANCE`."""
    return predicted == gold or math.isclose(float(predicted), float(gold), rel_tol=RELATIVE_TOLERANCE, abs_tol=1e-9)


def answer_matches(predicted: str | None, gold: object) -> bool:
    """Whether an extracted answer equals the gold answer (see the module docstring for the rules)."""
    expected = parse_gold(gold)
    if predicted is None:
        return False
    if isinstance(expected, str):
        choice = _CHOICE.match(predicted.strip())
        return choice is not None and choice.group(1).upper() == expected
    value = parse_number(predicted)
    return value is not None and numbers_match(value, expected)


def score(reply: str, gold: object) -> float:
    """1.0 if the final answer in ``reply`` is the gold answer, else 0.0 (a bad gold answer raises, whatever the
    reply)."""
    parse_gold(gold)
    return 1.0 if answer_matches(extract_answer(reply), gold) else 0.0
