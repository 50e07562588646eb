"""The dashboard of a real training run (``agl.train`` on the tiny model, through its server and worker
processes), opened as ``agl dashboard RUN_DIR`` does once the run is over."""

from __future__ import annotations

from pathlib import Path

import pytest
from chromium import wait_for
from dash_train_agent import reply_length_agent

import agentlightning as agl
from agentlightning._uvicorn import BackgroundServer
from agentlightning.server._dashboard import dashboard_app

pytest.importorskip("trl")


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
