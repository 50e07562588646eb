"""The RAG reward of the paper: ``0.9 x F1 + 0.1 x format``.

- *format* is 1 when the final reply holds exactly one non-empty ``<answer>...</answer>`` span, else 0;
- *F1* is the SQuAD word-level F1 between that answer and the gold answer (the best over the gold answer and its
  aliases), after SQuAD normalisation: lower case, punctuation removed, articles (a, an, the) removed, whitespace
  collapsed. Without a well-formed answer span the F1 is 0, so a reply that ignores the format scores 0.

A gold answer that is empty after normalisation raises :class:`GoldAnswerError`.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

FORMAT_WEIGHT = 0.1
F1_WEIGHT = 0.9

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.IGNORECASE | re.DOTALL)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


class GoldAnswerError(ValueError):
    """A task's gold answer is missing or empty."""


@dataclass(frozen=True)
class RagScore:
    """The parts of the reward."""

    reward: float
    f1: float
    format_ok: bool
    answer: str | None


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(char for char in text.lower() if char not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def f1_score(prediction: str, gold: str) -> float:
    """SQuAD word-level F1 of ``prediction`` against ``gold`` (both normalised first)."""
    predicted_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    common = Counter(predicted_tokens) & Counter(gold_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(predicted_tokens)
    recall = overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def extract_answer(reply: str) -> str | None:
    """The text of the single ``<answer>`` span in ``reply``; None if there is none, several, or it is empty."""
    if not isinstance(reply, str):
        raise TypeError(f"reply must be a string, got {type(reply).__name__} {reply!r}")
    spans = _ANSWER.findall(reply)
    if len(spans) != 1 or not spans[0].strip():
        return None
    return spans[0].strip()


def gold_answers(answer: object, aliases: Sequence[str] | None = None) -> list[str]:
    """The gold answer followed by its aliases; :class:`GoldAnswerError` when the answer is unusable."""
    if not isinstance(answer, str) or not normalize_answer(answer):
        raise GoldAnswerError(f"gold answer must be a non-empty string, got {answer!r}")
    return [answer, *[alias for alias in (aliases or []) if isinstance(alias, str) and normalize_answer(alias)]]


def score(reply: str, answer: str, aliases: Sequence[str] | None = None) -> RagScore:
    """Score a final reply against the gold ``answer`` (and ``aliases``)."""
    golds = gold_answers(answer, aliases)
    predicted = extract_answer(reply)
    if predicted is None:
        return RagScore(reward=0.0, f1=0.0, format_ok=False, answer=None)
    f1 = max(f1_score(predicted, gold) for gold in golds)
    return RagScore(reward=F1_WEIGHT * f1 + FORMAT_WEIGHT, f1=f1, format_ok=True, answer=predicted)
