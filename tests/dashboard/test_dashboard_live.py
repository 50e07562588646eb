"""A rollout still running: its page shows the calls the proxy has recorded so far, and the next one as it lands,
without a reload."""

from __future__ import annotations

from pathlib import Path

import openai
from chromium import wait_for

from agentlightning.server import LightningServer
from agentlightning.testing import MockLLMServer


def test_a_running_rollouts_calls_appear_as_they_are_made(browser, tmp_path: Path) -> None:
    with (
        MockLLMServer() as mock,
        LightningServer(
            tmp_path / "store.db", upstream_url=mock.base_url, model_name="mock-model", model_version="v7"
        ) as server,
    ):
        (rollout_id,) = server.enqueue([{"question": "live"}])
        lease = server.store.dequeue("w-live", 30.0)  # a worker holds it: running, no result yet
        assert lease is not None and lease.rollout_id == rollout_id
        agent = openai.OpenAI(base_url=f"{server.url}/rollouts/{rollout_id}/v1", api_key="x", max_retries=0)

        def ask(text: str) -> None:
            agent.chat.completions.create(model="mock-model", messages=[{"role": "user", "content": text}])

        ask("first question")
        browser.get(f"{server.url}/ui/?live#/rollout/{rollout_id}")
        wait_for(browser, "h2 .badge.running")
        card = wait_for(browser, "#calls .card")[0]
        assert "first question" in card.text and "model v7" in card.text and "(server)" in card.text
        assert "1 calls of this attempt" in browser.find_element("css selector", '#attempts tr[data-attempt="1"]').text
        ask("second question")
        cards = wait_for(browser, "#calls .card", lambda found: len(found) == 2, timeout=15)
        assert "echo: second question" in cards[1].get_attribute("textContent")
        browser.get(f"{server.url}/ui/?live#/run")  # no metrics.jsonl beside this store: its batches make the curve
        batch = wait_for(browser, 'svg[data-metric="batch failed rollouts"]')[0]
        assert batch.get_attribute("data-points") == "1"
        assert "no metrics.jsonl" in browser.find_element("id", "curve-note").text
        assert "running" in browser.find_element("tag name", "main").text
