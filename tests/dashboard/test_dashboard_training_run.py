"""The dashboard of a real training run (``agl.train`` on the tiny model, through its server and worker
processes), opened as ``agl dashboard RUN_DIR`` does once the run is over."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from chromium import wait_for
from dash_train_agent import reply_length_agent

import agentlightning as agl
from agentlightning._uvicorn import BackgroundServer
from agentlightning.server._dashboard import dashboard_app

pytest.importorskip("trl")

HERE = Path(__file__).resolve().parent


@pytest.mark.slow
def test_a_training_runs_curves_rollouts_and_groups(browser, tmp_path: Path) -> None:
    from agentlightning.trainers.models import tiny_model

    model, tokenizer = tiny_model(seed=1)
    tasks = [{"id": f"t{i}", "question": f"What is {i} + {i}?"} for i in range(2)]
    result = agl.train(
        reply_length_agent,
        tasks,
        model=model,
        tokenizer=tokenizer,
        group_size=4,
        tasks_per_step=2,
        max_steps=2,
        learning_rate=1e-2,
        micro_batch_size=4,
        max_completion_length=8,
        output_dir=tmp_path / "run",
        nworkers=1,
        progress=False,
        save_model=False,
    )
    server = BackgroundServer(dashboard_app(tmp_path / "run"), name="dashboard", timeout_graceful_shutdown=1).start()
    try:
        browser.get(f"{server.url}/ui/?training#/run")
        reward = wait_for(browser, 'svg[data-metric="reward"]')[0]
        assert reward.get_attribute("data-points") == str(len(result.history)) == "2"
        assert browser.find_elements("css selector", 'svg[data-metric="train/loss"]')
        assert "v0" in browser.find_element("tag name", "main").text  # the model versions that served the steps

        browser.get(f"{server.url}/ui/?training#/task/t0")
        groups = wait_for(browser, "#groups tr.group", lambda found: len(found) == 2)
        assert [g.find_elements("tag name", "td")[0].text for g in groups] == ["step1:t0", "step0:t0"]
        assert [g.find_elements("tag name", "td")[1].text for g in groups] == ["v1", "v0"]  # newest first
        assert all(len(g.find_elements("css selector", "a.cell")) == 4 for g in groups)
        groups[0].find_element("css selector", "a.cell").click()
        card = wait_for(browser, "#calls .card")[0]
        assert "role" in card.text and "(server)" in card.text and "model v1" in card.text
        assert "mean logprob" in card.text  # training asks the backend for the sampling logprobs
    finally:
        server.stop()


@pytest.mark.slow
def test_a_run_that_trained_nothing_says_why_at_the_top(browser, tmp_path: Path) -> None:
    """Issue 35: ``agl train --roles sovler`` (a typo) with ``--allow-no-update``: the run page opens with the
    banner that nothing trained and the step warning naming the roles seen; the role's curves are there."""
    from agentlightning.trainers.models import tiny_model

    model, tokenizer = tiny_model(seed=2)
    model.save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"t{i}", "question": f"{i} + {i}?"}) + "\n" for i in range(2)))
    command = [sys.executable, "-m", "agentlightning._cli", "train", "dash_train_agent:solver_agent"]
    command += ["--dataset", str(tasks), "--model", str(tmp_path / "tiny"), "--roles", "sovler", "--group-size", "2"]
    command += ["--tasks-per-step", "2", "--max-steps", "2", "--max-completion-length", "6", "--no-use-server"]
    command += ["--no-progress", "--allow-no-update", "--output-dir", str(tmp_path / "run")]
    done = subprocess.run(
        command, cwd=HERE, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Setting accelerator to CPU" not in done.stdout + done.stderr  # DeepSpeed's notice, in our words at INFO
    server = BackgroundServer(dashboard_app(tmp_path / "run"), name="dashboard", timeout_graceful_shutdown=1).start()
    try:
        browser.get(f"{server.url}/ui/?nothing-trained#/run")
        first = wait_for(browser, "li.warning")[0]
        assert first.get_attribute("data-kind") == "nothing-trained"
        assert "Nothing trained: none of the 2 steps changed the model (v0 is the model it started with)" in first.text
        steps = [item.text for item in browser.find_elements("css selector", 'li.warning[data-kind="step"]')]
        assert "roles ['sovler'] matched no LLM call; roles seen: ['solver'] (steps 1–2)" in steps
        assert "nothing to train on (no transitions): the model is unchanged (steps 1–2)" in steps
        assert [svg.get_attribute("data-metric") for svg in browser.find_elements("css selector", "#headline svg")] == [
            "reward",
            "accuracy",
        ]
        flat = browser.find_element("id", "flat")
        flat.find_element("tag name", "summary").click()
        assert "role/solver/transitions = 0" in flat.text and "role/solver/llm_calls = 4" in flat.text
        assert "async/queue_depth = 0" in flat.text  # a synchronous run: no async/* chart
        assert not browser.find_elements("css selector", 'svg[data-metric^="async/"]')
    finally:
        server.stop()
