"""GSM8K-style math word problems for the Calc-X example: GSM8K, SVAMP, AQuA and the real Calc-X sample rows,
as tasks ``{"task_id", "question", "answer", "source"}`` with a fixed train / test split."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from examples.calc_x.reward import parse_gold
from examples.common import data_file, read_jsonl

SVAMP_TRAIN_SIZE = 700
SOURCES = ("gsm8k", "svamp", "aqua", "calcx_sample")
SPLITS = ("train", "test")


def _gsm8k(data_dir: Path, split: str) -> list[dict[str, Any]]:
    path = data_file(data_dir, f"calc_x/gsm8k/{split}.jsonl")
    tasks = []
    for index, row in enumerate(read_jsonl(path)):
        solution = row.get("answer", "")
        if "####" not in solution:
            raise ValueError(f"{path}: row {index} has no '#### <answer>' line: {solution[-80:]!r}")
        tasks.append(
            {
                "task_id": f"gsm8k-{split}-{index:05d}",
                "question": row["question"],
                "answer": solution.rsplit("####", 1)[1].strip().replace(",", ""),
                "source": "gsm8k",
            }
        )
    return tasks


def _svamp(data_dir: Path, split: str) -> list[dict[str, Any]]:
    rows = json.loads(data_file(data_dir, "calc_x/svamp/SVAMP.json").read_text(encoding="utf-8"))
    chosen = rows[:SVAMP_TRAIN_SIZE] if split == "train" else rows[SVAMP_TRAIN_SIZE:]
    return [
        {
            "task_id": f"svamp-{row['ID']}",
            "question": f"{row['Body'].strip().rstrip('.')}. {row['Question'].strip()}",
            "answer": _plain(row["Answer"]),
            "source": "svamp",
        }
        for row in chosen
    ]


def _aqua(data_dir: Path, split: str) -> list[dict[str, Any]]:
    path = data_file(data_dir, f"calc_x/aqua_rat/{'dev' if split == 'train' else 'test'}.json")
    return [
        {
            "task_id": f"aqua-{split}-{index:04d}",
            "question": f"{row['question']}\nChoose the correct choice\n{' '.join(row['options'])}",
            "answer": row["correct"],
            "source": "aqua",
        }
        for index, row in enumerate(read_jsonl(path))
    ]


def _calcx_sample(data_dir: Path, split: str) -> list[dict[str, Any]]:
    if split != "train":
        return []
    path = data_file(data_dir, "calc_x/calcx_sample/sample.jsonl")
    return [
        {"task_id": f"calcx-{row['id']}", "question": row["question"], "answer": str(row["result"]), "source": "calcx"}
        for row in read_jsonl(path)
    ]


_LOADERS: dict[str, Callable[[Path, str], list[dict[str, Any]]]] = {
    "gsm8k": _gsm8k,
    "svamp": _svamp,
    "aqua": _aqua,
    "calcx_sample": _calcx_sample,
}


def load_tasks(
    data_dir: Path, split: str, sources: Sequence[str] = ("gsm8k", "svamp", "calcx_sample")
) -> list[dict[str, Any]]:
    """Tasks of ``split`` ('train' or 'test') from ``sources``; every gold answer is checked to be scorable.

    Split: GSM8K train/test files; SVAMP rows 0-699 train, 700-999 test; AQuA dev/test; the 10 Calc-X sample rows
    are training only.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    unknown = [source for source in sources if source not in _LOADERS]
    if unknown:
        raise ValueError(f"unknown Calc-X source(s) {unknown}; choose from {list(_LOADERS)}")
    tasks = [task for source in sources for task in _LOADERS[source](Path(data_dir), split)]
    for task in tasks:
        parse_gold(task["answer"])  # raises GoldAnswerError naming the answer
    return tasks


def _plain(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
