"""The SVAMP benchmark: the committed one-operation split, the results table, and the whole command end to end
on the tiny random model (base evaluation -> GRPO through the server and workers -> evaluation of the run's model
-> curve and results row)."""

from __future__ import annotations

import json
from pathlib import Path

from agentlightning.trainers.models import tiny_model

from agentlightning.evaluation import EvalReport
from examples.calc_x import svamp
from examples.calc_x.data import SVAMP_SPLIT_FILE, load_svamp_one_op, make_svamp_split, svamp_operations
from examples.calc_x.reward import parse_gold


def test_the_committed_split_is_the_documented_one(data_dir: Path) -> None:
    rows = json.loads((data_dir / "calc_x" / "svamp" / "SVAMP.json").read_text())
    committed = json.loads(SVAMP_SPLIT_FILE.read_text())
    assert {key: committed[key] for key in ("train", "heldout")} == make_svamp_split(rows)
    assert len(committed["train"]) == 600 and len(committed["heldout"]) == 162
    assert not set(committed["train"]) & set(committed["heldout"])
    one_op = {row["ID"] for row in rows if svamp_operations(row["Equation"]) == 1}
    assert len(one_op) == 762 and set(committed["train"]) | set(committed["heldout"]) == one_op
    heldout = load_svamp_one_op(data_dir, "heldout")
    assert [task["task_id"] for task in heldout] == [f"svamp-{i}" for i in committed["heldout"]]
    assert all(parse_gold(task["answer"]) is not None and task["question"].endswith("?") for task in heldout[:50])
    assert svamp_operations("( ( 8.0 + 7.0 ) - 3.0 )") == 2 and svamp_operations("( -3.0 + 4.0 )") == 1


def _summary(seed: int, base: float, final: float) -> dict:
    interval = lambda value: {"value": value, "low": value - 0.05, "high": value + 0.05}  # noqa: E731
    return {
        "arm": "grpo",
        "seed": seed,
        "command": "python -m examples.calc_x.svamp",
        "heldout": 162,
        "steps": 8,
        "minutes": {"total": 30.0, "base_eval": 5.0, "grpo": 20.0, "final_eval": 5.0},
        "base": interval(base),
        "final": interval(final),
        "difference": interval(final - base),
        "load": 2.5,
        "note": "",
        "finished": f"2026-12-03 0{seed}:00 UTC",
    }


def test_results_rows_go_under_the_svamp_heading_newest_first(tmp_path: Path) -> None:
    path = tmp_path / "results.md"
    path.write_text("# Results\n\n## Demo\n\nkept as it is\n")
    svamp.add_result_row(path, _summary(1, 0.1, 0.3))
    svamp.add_result_row(path, _summary(2, 0.1, 0.4))
    text = path.read_text()
    assert text.startswith("# Results\n\n## Demo\n\nkept as it is\n") and text.count("## SVAMP") == 1
    rows = [line for line in text.splitlines() if line.startswith("| 2026")]
    assert [row.split(" | ")[2] for row in rows] == ["2", "1"]  # newest first
    assert "| 0.100 [0.050, 0.150] | 0.400 [0.350, 0.450] | +0.300 [+0.250, +0.350] | 4.00x |" in rows[0]


def test_the_command_end_to_end_on_the_tiny_model(data_dir: Path, tmp_path: Path) -> None:
    model, tokenizer = tiny_model(seed=5)
    model.save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    sets = [f"model={tmp_path / 'tiny'}", "max_steps=1", "tasks_per_step=2", "group_size=2", "nworkers=2"]
    sets.append("allow_no_update=true")  # a random tiny model answers nothing right: every reward ties
    arguments = ["--data-dir", str(data_dir), "--output-dir", str(tmp_path / "runs"), "--heldout-limit", "3"]
    arguments += ["--max-tokens", "8", "--workers", "3", "--results", str(tmp_path / "results.md")]
    assert svamp.main([*arguments, *(item for pair in sets for item in ("--set", pair))]) == 0

    run = tmp_path / "runs" / "grpo-seed0"
    base = EvalReport.load(tmp_path / "runs" / "base" / "eval" / "tiny-heldout3-tok8.json")
    final = EvalReport.load(run / "grpo" / "eval" / "heldout.json")
    assert base.rollouts == final.rollouts == 3 and base.calls_by_role.keys() == {"calculator_assistant"}
    assert [t.task_id for t in final.per_task] == [t["task_id"] for t in load_svamp_one_op(data_dir, "heldout")[:3]]
    assert final.model_version and final.model_version != base.model_version
    summary = json.loads((run / "summary.json").read_text())
    assert summary["heldout"] == 3 and summary["steps"] == 1 and summary["base"] == base.accuracy.model_dump()
    assert (tmp_path / "runs" / "curve.png").stat().st_size > 1000
    assert "| grpo | 0 | 3 |" in (tmp_path / "results.md").read_text()
