"""A real training step of the Spider and RAG examples on their data, with a tiny random model on CPU: the script
runs the real agent (LangChain, the Agents SDK), the real reward and the packing through ``agl.train``; the model
writes no valid SQL or answer, so every reward is 0 and the script exits 1 with its summary and one error line
naming the fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("example", ["spider", "rag"])
def test_a_real_training_step_that_learns_nothing_says_so_in_one_line(
    example: str, data_dir: Path, tmp_path: Path
) -> None:
    from agentlightning.trainers.models import tiny_model

    model, tokenizer = tiny_model(seed=0)
    model.save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    arguments = ["--data-dir", str(data_dir), "--model", str(tmp_path / "tiny"), "--max-steps", "1"]
    arguments += ["--group-size", "2", "--tasks-per-step", "1", "--max-completion-length", "8", "--val-size", "1"]
    arguments += ["--nworkers", "2", "--output-dir", str(tmp_path / "run")]
    run = subprocess.run(
        [sys.executable, "-m", f"examples.{example}.train", *arguments],
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 1, run.stderr[-3000:]
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    (error,) = [line for line in run.stderr.splitlines() if line.startswith("error: ")]
    assert "every rollout of a group got the same reward" in error and "--allow-no-update" in error
    assert "train reward: first step 0.000" in run.stdout
    assert (tmp_path / "run" / "metrics.jsonl").is_file()  # the run's record is kept
