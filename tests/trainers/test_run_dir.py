"""A fresh run directory per run (issue 35, item 5): a second ``agl train`` into a directory that holds a run is
refused (it used to delete metrics.jsonl, append to the same store.db and keep the old checkpoints), unless
``--resume`` or ``--overwrite``; the default is a new ``runs/agl-train-<date>-<time>`` each time."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from agentlightning.trainers._run_dir import fresh_run_directory, newest_run, run_directory
from agentlightning.trainers.config import TrainConfig

HERE = Path(__file__).resolve().parent


def _agl_train(cwd: Path, tiny: Path, *options: str) -> subprocess.CompletedProcess[str]:
    tasks = cwd / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"t{i}", "question": f"{i} + {i}?"}) + "\n" for i in range(2)))
    return subprocess.run(
        [sys.executable, "-m", "agentlightning._cli", "train", "train_agents:reply_length_agent"]
        + ["--dataset", str(tasks), "--model", str(tiny), "--group-size", "2", "--tasks-per-step", "2"]
        + ["--max-steps", "1", "--max-completion-length", "6", "--no-progress", "--no-save-model", "--allow-no-update"]
        + list(options),  # whether the tiny model learns is not the point here
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(HERE)},
        timeout=300,
    )


def _rollouts(store: Path) -> int:
    with sqlite3.connect(store) as db:
        return int(db.execute("SELECT COUNT(*) FROM rollouts").fetchone()[0])


@pytest.mark.slow
def test_a_second_run_never_mixes_into_the_first(tmp_path: Path) -> None:
    from agentlightning.trainers.models import tiny_model

    model, tokenizer = tiny_model(seed=3)
    model.save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    first = _agl_train(tmp_path, tmp_path / "tiny", "--output-dir", "runs/mine")
    assert first.returncode == 0, first.stderr[-2000:]
    stored = _rollouts(tmp_path / "runs/mine/store.db")

    again = _agl_train(tmp_path, tmp_path / "tiny", "--output-dir", "runs/mine")
    assert again.returncode == 2 and "Traceback" not in again.stderr
    assert "already holds a training run" in again.stderr and "--resume" in again.stderr
    assert "--overwrite" in again.stderr
    assert _rollouts(tmp_path / "runs/mine/store.db") == stored  # nothing appended, nothing deleted
    assert (tmp_path / "runs/mine/metrics.jsonl").exists()

    replaced = _agl_train(tmp_path, tmp_path / "tiny", "--output-dir", "runs/mine", "--overwrite")
    assert replaced.returncode == 0, replaced.stderr[-2000:]
    assert _rollouts(tmp_path / "runs/mine/store.db") == stored  # the new run's rollouts only
    rows = (tmp_path / "runs/mine/metrics.jsonl").read_text().splitlines()
    assert [json.loads(row)["step"] for row in rows] == [1]

    default = [_agl_train(tmp_path, tmp_path / "tiny") for _ in range(2)]  # no --output-dir: one folder per run
    assert [done.returncode for done in default] == [0, 0], default[-1].stderr[-2000:]
    made = sorted(path.name for path in (tmp_path / "runs").glob("agl-train-*"))
    assert len(made) == 2, made
    assert all(name in done.stdout for name, done in zip(made, default, strict=True))


def test_resume_true_without_a_directory_continues_the_newest_run(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert newest_run() is None
    older, newer = Path("runs/agl-train-20260101-000000"), Path("runs/agl-train-20260102-000000")
    for path, stamp in ((older, 1_000_000_000), (newer, 1_000_000_100)):
        (path / "checkpoints").mkdir(parents=True)
        os.utime(path, (stamp, stamp))
    assert run_directory(TrainConfig(resume=True)) == newer
    fresh = run_directory(TrainConfig())
    assert fresh.parent == Path("runs") and fresh.name.startswith("agl-train-") and not fresh.exists()
    fresh.mkdir()
    assert fresh_run_directory() != fresh  # one started in the same second gets its own
    with pytest.raises(ValueError, match="continue the run or replace it, not both"):
        TrainConfig(resume=True, overwrite=True)


def test_a_store_without_rollouts_is_this_runs_own(tmp_path: Path) -> None:
    """``agl server --model --store OUT/store.db --output-dir OUT`` creates the store before the run starts."""
    from agentlightning.server.store import SQLiteStore

    store = SQLiteStore(tmp_path / "store.db")
    try:
        store.add_dataset([{"q": "x"}])
        assert run_directory(TrainConfig(output_dir=tmp_path)) == tmp_path
        store.enqueue(store.dataset_tasks(store.list_datasets()[0].dataset_id), group_size=1)
        store.flush()
        with pytest.raises(ValueError, match=r"already holds a training run \(store.db"):
            run_directory(TrainConfig(output_dir=tmp_path))
    finally:
        store.close()
