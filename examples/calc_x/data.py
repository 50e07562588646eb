"""GSM8K-style math word problems for the Calc-X example: GSM8K, SVAMP, AQuA and the real Calc-X sample rows,
as tasks ``{"task_id", "question", "answer", "source"}`` with a fixed train / test split."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from examples.calc_x.reward import parse_gold
from examples.common import data_file, read_jsonl

SVAMP_TRAIN_SIZE = 700
SVAMP_SPLIT_FILE = Path(__file__).with_name("svamp_one_op_split.json")
"""The fixed split of SVAMP's one-operation problems, as ``ID`` lists (see :func:`make_svamp_split`)."""
SVAMP_SPLITS = ("train", "heldout")
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
    return [_svamp_task(row) for row in chosen]


def _svamp_task(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "task_id": f"svamp-{row['ID']}",
        "question": f"{row['Body'].strip().rstrip('.')}. {row['Question'].strip()}",
        "answer": _plain(row["Answer"]),
        "source": "svamp",
    }


def svamp_operations(equation: str) -> int:
    """How many arithmetic operations an SVAMP ``Equation`` has (``( 76.0 - 25.0 )`` has one)."""
    return len(re.findall(r"[-+*/]", re.sub(r"(?<=\()\s*-", "", equation)))


def make_svamp_split(rows: Sequence[dict[str, Any]], heldout: int = 162, seed: int = 34) -> dict[str, list[str]]:
    """The one-operation problems of SVAMP split by ``ID``: ``heldout`` of them drawn at random (``seed``), the rest
    for training; each list is in the file's order. This made :data:`SVAMP_SPLIT_FILE` (600 / 162)."""
    ids = [row["ID"] for row in rows if svamp_operations(row["Equation"]) == 1]
    chosen = set(random.Random(seed).sample(ids, heldout))
    return {"train": [i for i in ids if i not in chosen], "heldout": [i for i in ids if i in chosen]}


def load_svamp_one_op(data_dir: Path, split: str) -> list[dict[str, Any]]:
    """SVAMP one-operation tasks of ``split`` (``"train"``: 600, ``"heldout"``: 162), by the committed IDs of
    :data:`SVAMP_SPLIT_FILE`; an ID missing from the data file is an error naming it."""
    if split not in SVAMP_SPLITS:
        raise ValueError(f"SVAMP split must be one of {SVAMP_SPLITS}, got {split!r}")
    rows = {row["ID"]: row for row in json.loads(data_file(data_dir, "calc_x/svamp/SVAMP.json").read_text("utf-8"))}
    ids = json.loads(SVAMP_SPLIT_FILE.read_text(encoding="utf-8"))[split]
    missing = [i for i in ids if i not in rows]
    if missing:
        raise ValueError(f"{SVAMP_SPLIT_FILE.name}: IDs {missing[:5]} are not in SVAMP.json (another SVAMP release?)")
    return [_svamp_task(rows[i]) for i in ids]


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
