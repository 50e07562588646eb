"""A long step says it is alive (issue 35, item 4): ``agl train`` logs where the step's rollouts stand and the
completion tokens per second while it waits for them; DeepSpeed's stdout notice is replaced by one line of ours."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}
PROGRESS = re.compile(
    r"step 1, (\d+) s: (\d) of 2 rollouts finished, (\d) running, (\d) queued; ([\d.]+) completion tokens/s"
)

pytest.importorskip("trl")


@pytest.mark.slow
def test_a_slow_step_logs_its_rollouts_and_tokens_per_second(tmp_path: Path) -> None:
    from agentlightning.trainers.models import tiny_model

    model, tokenizer = tiny_model(seed=4)
    model.save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "t0", "question": "1 + 1?", "sleep": 7}) + "\n")
    command = [sys.executable, "-m", "agentlightning._cli", "train", "train_agents:slow_agent", "--dataset", str(tasks)]
    command += ["--model", str(tmp_path / "tiny"), "--group-size", "2", "--tasks-per-step", "1", "--max-steps", "1"]
    command += ["--max-completion-length", "8", "--nworkers", "1", "--no-progress", "--allow-no-update"]
    command += ["--output-dir", str(tmp_path / "run")]
    done = subprocess.run(command, cwd=HERE, capture_output=True, text=True, env=ENV, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if PROGRESS.search(line)]
    assert lines, done.stderr[-3000:]  # one worker, two rollouts of 7 s each: the step waits over 10 s
    assert "INFO" in lines[0]  # shown at the default level, without -v
    seconds, finished, running, queued, rate = PROGRESS.search(lines[0]).groups()
    assert int(seconds) >= 10 and int(finished) + int(running) + int(queued) == 2 and int(running) == 1
    assert float(rate) > 0  # the proxy counted the first rollout's completion tokens
    assert "Setting accelerator to CPU" not in done.stdout + done.stderr


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed is not installed")
def test_deepspeeds_cpu_notice_becomes_one_line_of_ours() -> None:
    script = "import logging; logging.basicConfig(level=logging.INFO); import agentlightning.trainers; import deepspeed"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=ENV, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Setting accelerator to CPU" not in done.stdout + done.stderr
    import torch

    if torch.version.cuda is None:
        assert "INFO:agentlightning.trainers._deepspeed_notice:no GPU in this torch build (CPU only)" in done.stderr
    else:
        assert "WARNING:agentlightning.trainers._deepspeed_notice:torch is built for CUDA" in done.stderr
