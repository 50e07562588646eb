"""A rollout whose second LLM call in-process capture missed (sent with urllib) while the proxy served it: the
Rollouts table counts the missed call on its row, and its page warns with the served and captured counts, the cause
and the fix, and marks the missed call in the conversation. A rollout captured in full shows none of it."""

from __future__ import annotations

from pathlib import Path

import dash_agents
from chromium import wait_for

from agentlightning.client import start_workers
from agentlightning.server import LightningServer
from agentlightning.testing import MockLLMServer


def test_calls_capture_missed_are_counted_in_the_list_and_warned_about_on_the_rollout(browser, tmp_path: Path) -> None:
    with (
        MockLLMServer(token_ids=True) as mock,
        LightningServer(tmp_path / "store.db", upstream_url=mock.base_url, model_name="mock-model") as server,
    ):
        gap, full = server.enqueue(
            [{"id": "gap", "question": "q gap", "client": "urllib"}, {"id": "full", "question": "q full", "client": ""}]
        )
        pool = start_workers(dash_agents.gap_agent, server.url, nworkers=1, spool_dir=str(tmp_path / "spool"))
        try:
            rollouts = server.wait([gap, full], timeout=60)
        finally:
            server.request_stop()
            assert pool.wait(20)
        assert [r.status for r in rollouts] == ["succeeded", "succeeded"], [r.error for r in rollouts]

        browser.get(f"{server.url}/ui/?gap#/rollouts")
        rows = wait_for(browser, "#rollouts tbody tr[data-rollout]", lambda found: len(found) == 2)
        calls = {row.get_attribute("data-rollout"): row.find_elements("tag name", "td")[6] for row in rows}
        assert calls[gap].text == "2 1 missed by capture"  # the calls column: 2 calls, 1 of them missed
        assert calls[gap].find_element("css selector", ".badge.missed").text == "1 missed by capture"
        assert calls[full].text == "2" and not calls[full].find_elements("css selector", ".missed")

        browser.get(f"{server.url}/ui/?gap#/rollout/{gap}")
        warning = wait_for(browser, "#capture-gap")[0].text
        assert "In-process capture missed 1 of the 2 LLM calls the proxy served (recorded 1;" in warning
        assert "the proxy served 2 LLM calls but in-process capture recorded only 1" in warning
        assert "Likely cause: a framework or client that Agent Lightning does not instrument" in warning
        assert "agl.instrument('<name>')" in warning and "docs/capture.md" in warning
        assert not [pre.text for pre in browser.find_elements("tag name", "pre") if "captured in-process" in pre.text]
        captured, missed = wait_for(browser, "#calls .card", lambda found: len(found) == 2)
        assert "missed" not in captured.get_attribute("class") and not captured.find_elements("css selector", ".missed")
        assert "missed" in missed.get_attribute("class")
        assert missed.find_element("css selector", ".meta .badge.missed").text == "missed by capture"
        assert "role —" in missed.text and "echo: echo: q gap" in missed.text  # the proxy's record: no role

        browser.get(f"{server.url}/ui/?full#/rollout/{full}")
        wait_for(browser, "#calls .card", lambda found: len(found) == 2)
        assert not browser.find_elements("id", "capture-gap") and not browser.find_elements("css selector", ".missed")
