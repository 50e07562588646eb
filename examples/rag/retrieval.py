"""BM25 retrieval over the MuSiQue and HotpotQA paragraphs (``rank-bm25``), built once per process."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from rank_bm25 import BM25Okapi

from examples.common import data_file

_WORD = re.compile(r"[a-z0-9]+")
_STOPWORDS = frozenset(
    "a an the of in on at to for by with from and or is was were are be been who whom whose what which when where "
    "how why did does do that this as it its".split()
)


@dataclass(frozen=True)
class Passage:
    """A titled paragraph of the corpus."""

    title: str
    text: str

    def render(self) -> str:
        """How the passage is shown to the agent."""
        return f"{self.title}: {self.text}"


def tokenize(text: str) -> list[str]:
    """Lower-case word tokens without stop words."""
    return [word for word in _WORD.findall(text.lower()) if word not in _STOPWORDS]


class BM25Index:
    """Top-k BM25 search over passages."""

    def __init__(self, passages: Iterable[Passage]) -> None:
        unique: dict[tuple[str, str], Passage] = {}
        for passage in passages:
            unique.setdefault((passage.title, passage.text), passage)
        self.passages = list(unique.values())
        if not self.passages:
            raise ValueError("cannot build a BM25 index over an empty corpus")
        self._bm25 = BM25Okapi([tokenize(p.render()) for p in self.passages])

    def search(self, query: str, k: int = 3) -> list[Passage]:
        """The ``k`` best passages for ``query`` (empty for a query without words)."""
        tokens = tokenize(query)
        if not tokens:
            return []
        scores = self._bm25.get_scores(tokens)
        best = sorted(range(len(scores)), key=lambda index: (-scores[index], index))[:k]
        return [self.passages[index] for index in best if scores[index] > 0]


def corpus(data_dir: Path) -> list[Passage]:
    """Every paragraph of the MuSiQue and HotpotQA files (train corpora and the dev questions' paragraphs)."""
    passages: list[Passage] = []
    musique = json.loads(data_file(data_dir, "musique/hipporag_musique_train_100_corpus.json").read_text("utf-8"))
    passages += [Passage(row["title"], row["text"]) for row in musique]
    hotpot = json.loads(data_file(data_dir, "hotpotqa/hipporag_hotpotqa_train_100_corpus.json").read_text("utf-8"))
    passages += [Passage(title, "".join(sentences).strip()) for title, sentences in hotpot.items()]
    for question in json.loads(data_file(data_dir, "musique/kag_musique_qa_100.json").read_text("utf-8")):
        passages += [Passage(p["title"], p["paragraph_text"]) for p in question["paragraphs"]]
    return passages


@lru_cache(maxsize=4)
def index_for(data_dir: str) -> BM25Index:
    """The process-wide index over :func:`corpus` of ``data_dir``."""
    return BM25Index(corpus(Path(data_dir)))
