"""Multi-hop questions for the RAG example: MuSiQue and HotpotQA training questions, MuSiQue dev held out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from examples.common import data_file
from examples.rag.reward import gold_answers

SPLITS = ("train", "test")


def load_tasks(data_dir: Path, split: str) -> list[dict[str, Any]]:
    """Tasks ``{"task_id", "question", "answer", "aliases", "source"}``.

    train: the 100 MuSiQue-Ans train and 100 HotpotQA train questions; test: the 100 MuSiQue-Ans dev questions
    (unanswerable ones skipped). Every gold answer is checked to be scorable.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    data_dir = Path(data_dir)
    tasks: list[dict[str, Any]] = []
    musique_file = "musique/hipporag_musique_train_100.json" if split == "train" else "musique/kag_musique_qa_100.json"
    for row in json.loads(data_file(data_dir, musique_file).read_text("utf-8")):
        if row.get("answerable", True):
            tasks.append(
                {
                    "task_id": f"musique-{row['id']}",
                    "question": row["question"],
                    "answer": row["answer"],
                    "aliases": list(row.get("answer_aliases", [])),
                    "source": "musique",
                }
            )
    if split == "train":
        for row in json.loads(data_file(data_dir, "hotpotqa/hipporag_hotpotqa_train_100.json").read_text("utf-8")):
            tasks.append(
                {
                    "task_id": f"hotpotqa-{row['_id']}",
                    "question": row["question"],
                    "answer": row["answer"],
                    "aliases": [],
                    "source": "hotpotqa",
                }
            )
    for task in tasks:
        gold_answers(task["answer"], task["aliases"])
    return tasks
