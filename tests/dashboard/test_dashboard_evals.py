"""The run page lists the reports ``agl.evaluate`` wrote beside a run (``<run>/eval/*.json``) with their 95%
intervals: ``agl dashboard RUN_DIR`` in a real process, its API and headless Chromium."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
from chromium import wait_for
from conftest import write_metrics
from test_dashboard_cli import free_port

import agentlightning as agl
from agentlightning.testing import MockLLMServer


@agl.rollout
def echo_agent(task: dict, llm: agl.LLM) -> float:
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    reply = client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": task["q"]}])
    return 1.0 if reply.choices[0].message.content == task["q"] else 0.0


def test_the_run_page_shows_the_runs_evaluations(browser, tmp_path: Path) -> None:
    write_metrics(tmp_path / "metrics.jsonl", range(1, 3))
    tasks = [{"id": f"t{i}", "q": f"say {i}"} for i in range(5)]
    with MockLLMServer(handler=lambda request: "say 1") as server:  # right on one task of five
        report = agl.evaluate(echo_agent, tasks, server.base_url, name="heldout", output=tmp_path / "eval" / "h.json")
    (tmp_path / "eval" / "broken.json").write_text("{not json")
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "agentlightning._cli", "dashboard", str(tmp_path), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                evals = httpx.get(f"{url}/ui/api/evals").json()
                break
            except httpx.TransportError:
                assert process.poll() is None and time.monotonic() < deadline, process.stdout.read()
                time.sleep(0.1)
        good = next(entry for entry in evals if entry["file"] == "h.json")
        assert good["accuracy"] == report.accuracy.model_dump() and good["rollouts"] == 5
        assert "not an evaluation report" in next(e for e in evals if e["file"] == "broken.json")["error"]
        browser.get(f"{url}/ui/#/run")
        (row,) = wait_for(browser, "#evals tr[data-eval]")
        cells = [cell.text for cell in row.find_elements("css selector", "td")]
        assert cells[0] == "heldout" and cells[2] == "5"
        assert cells[3] == f"0.2 [{float(f'{report.accuracy.low:.3g}'):g}, {float(f'{report.accuracy.high:.3g}'):g}]"
    finally:
        process.terminate()
        process.wait(10)
