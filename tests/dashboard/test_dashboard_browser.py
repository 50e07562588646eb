"""The dashboard's pages in headless Chromium, against a server holding rollouts that real workers ran.
``AGL_DASHBOARD_SCREENSHOTS=docs/images`` also saves a screenshot of each page there (how docs/dashboard.md's
pictures are made)."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest
from chromium import wait_for
from conftest import RUN_WARNING, TOKEN, TYPO_WARNING, Run, write_metrics

pytest.importorskip("langchain_openai")

SHOTS = os.environ.get("AGL_DASHBOARD_SCREENSHOTS")
LOADS = itertools.count()


def shot(browser, name: str) -> None:
    """A screenshot of the whole page (up to 2400 pixels high) when AGL_DASHBOARD_SCREENSHOTS names a folder."""
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        height = browser.execute_script("return document.documentElement.scrollHeight")
        browser.set_window_size(1400, min(max(height, 1000), 2400))
        browser.save_screenshot(str(Path(SHOTS) / f"dashboard-{name}.png"))
        browser.set_window_size(1400, 1000)


def open_page(browser, run: Run, hash_path: str) -> None:
    """Load the page afresh (a new query string: not a same-document navigation) at ``hash_path``, with the token
    in the tab's session storage as the login form leaves it."""
    browser.get(f"{run.server.url}/ui/?login")
    browser.execute_script("sessionStorage.setItem('aglToken', arguments[0])", TOKEN)
    browser.get(f"{run.server.url}/ui/?load={next(LOADS)}{hash_path}")


def test_without_the_token_nothing_is_shown_and_the_token_opens_it(browser, run: Run) -> None:
    browser.get(run.url("#/rollouts"))
    browser.execute_script("sessionStorage.clear()")
    browser.refresh()
    message = wait_for(browser, "#login-message", lambda found: "Refused" in found[0].text)[0]
    assert "missing bearer token" in message.text
    assert not browser.find_elements("css selector", "#rollouts tbody tr")
    browser.find_element("id", "token").send_keys("wrong")
    browser.find_element("css selector", "#login button").click()
    wait_for(browser, "#login-message", lambda found: "invalid bearer token" in found[0].text)
    field = browser.find_element("id", "token")
    field.clear()
    field.send_keys(TOKEN)
    browser.find_element("css selector", "#login button").click()
    rows = wait_for(browser, "#rollouts tbody tr[data-rollout]", lambda found: len(found) == 21)
    assert len(rows) == 21


def chart_names(browser, css: str) -> list[str]:
    return [svg.get_attribute("data-metric") for svg in browser.find_elements("css selector", f"{css} svg.chart")]


def test_run_page_leads_with_reward_and_roles_hides_flat_metrics_and_a_new_step_appears_live(browser, run: Run) -> None:
    open_page(browser, run, "#/run")
    reward = wait_for(browser, '#headline svg[data-metric="reward"]')[0]
    assert reward.get_attribute("data-points") == "3"
    assert len(reward.find_elements("css selector", "circle")) == 3
    assert chart_names(browser, "#headline") == ["reward", "accuracy"]
    by_role = browser.find_element("css selector", '#role-charts svg[data-metric="reward by role"]')
    assert by_role.get_attribute("data-series-count") == "2"
    assert {g.get_attribute("data-series") for g in by_role.find_elements("css selector", "g")} == {"checker", "solver"}
    others = chart_names(browser, "#charts")
    assert others[0] == "train/kl" and "staleness (calls off-version)" in others
    # A synchronous run's async/* columns, and what stayed the same every step, are named with their value only.
    assert not [name for name in chart_names(browser, "main") if name.startswith("async/")]
    flat = browser.find_element("id", "flat")
    assert "never moved over the 3 steps" in flat.text
    flat.find_element("tag name", "summary").click()
    shown = {
        item.get_attribute("data-metric"): item.text for item in flat.find_elements("css selector", ".flat-metric")
    }
    assert shown["async/queue_depth"] == "async/queue_depth = 0"
    assert shown["throughput (rollouts/s)"] == "throughput (rollouts/s) = 4"
    assert shown["role/checker/transitions"] == "role/checker/transitions = 0"
    assert "transitions by role" not in chart_names(browser, "main")
    warnings = {
        item.get_attribute("data-kind"): item.text for item in browser.find_elements("css selector", "li.warning")
    }
    assert warnings["step"] == f"{TYPO_WARNING} (steps 2–3)"
    assert warnings["run"] == f"{RUN_WARNING} (agentlightning.server._proxy, 2 times)"
    assert warnings["retried"].startswith("5 rollouts retried (an attempt crashed")  # 4 flaky ones, the crashed one
    assert warnings["failed"] == "1 rollout failed on the last attempt"
    assert "nothing-trained" not in warnings
    assert "v1" in browser.find_element("tag name", "main").text and "v2" in browser.page_source
    shot(browser, "run")
    write_metrics(run.run_dir / "metrics.jsonl", range(4, 5))  # the run writes its next step
    wait_for(browser, 'svg[data-metric="reward"]', lambda found: found[0].get_attribute("data-points") == "4")
    assert len(browser.find_elements("css selector", 'svg[data-metric="reward"] circle')) == 4


def rows_for(browser, *query: str) -> list:
    """The table's rows once it shows the answer to a request with every one of ``query`` (and only then: a table
    drawn for an earlier state of the filters does not count)."""
    table = wait_for(
        browser,
        "#rollouts",
        lambda found: all(part in found[0].get_attribute("data-query").split("&") for part in query),
    )[0]
    return table.find_elements("css selector", "tbody tr[data-rollout]")


def test_filters_and_sorting_narrow_and_order_the_table(browser, run: Run) -> None:
    from selenium.webdriver.support.ui import Select

    open_page(browser, run, "#/rollouts")
    assert len(rows_for(browser, "sort=created")) == 21
    shot(browser, "rollouts")
    browser.find_element("name", "failed").click()
    rows = rows_for(browser, "failed=true")
    assert [row.get_attribute("data-rollout") for row in rows] == run.crashed
    browser.find_element("name", "failed").click()
    browser.find_element("name", "retried").click()
    rows = rows_for(browser, "retried=true")
    assert {row.get_attribute("data-rollout") for row in rows} == set(run.flaky + run.crashed)
    browser.find_element("name", "retried").click()
    Select(browser.find_element("name", "status")).select_by_value("succeeded")
    browser.find_element("name", "model_version").send_keys("v1")
    browser.find_element("name", "reward_min").send_keys("0.3")
    rows = rows_for(browser, "status=succeeded", "model_version=v1", "reward_min=0.3")
    assert len(rows) == 4 and {row.find_elements("tag name", "td")[2].text for row in rows} == {"t1"}
    assert "1–4 of 4" in browser.find_element("id", "range").text
    assert "reward_min=0.3" in browser.current_url  # the filters live in the URL: shareable, kept on reload
    for name in ("model_version", "reward_min"):
        browser.find_element("name", name).clear()
    browser.find_element("name", "role").send_keys("solver")
    assert len(rows_for(browser, "status=succeeded", "role=solver")) == 20
    browser.find_element("css selector", 'th[data-sort="reward"]').click()  # highest reward first
    rewards = [float(row.find_elements("tag name", "td")[5].text) for row in rows_for(browser, "sort=reward")]
    assert rewards[0] == 1 and rewards == sorted(rewards, reverse=True) and len(rewards) == 20


def test_a_failed_rollout_shows_its_traceback_logs_and_every_attempt(browser, run: Run) -> None:
    open_page(browser, run, f"#/rollout/{run.crashed[0]}")
    traceback = wait_for(browser, ".error-box pre.traceback")[0]
    assert "ValueError: agent bug on qbad" in traceback.text and "dash_agents.py" in traceback.text
    attempts = browser.find_elements("css selector", "#attempts tbody tr")
    assert [row.get_attribute("data-attempt") for row in attempts] == ["1", "2"]
    assert "agent bug on qbad" in attempts[0].text
    assert "solved qbad on attempt 2" in browser.find_element("id", "logs").get_attribute("textContent")
    shot(browser, "rollout-failed")


def test_a_rollout_reads_as_a_conversation_with_the_tool_error_on_its_call(browser, run: Run) -> None:
    open_page(browser, run, f"#/rollout/{run.flaky[0]}")
    cards = wait_for(browser, "#calls .card", lambda found: len(found) == 4)
    first, added, looked_up, last = cards
    assert "llm" in first.text and "role solver" in first.text and "model v2" in first.text
    assert "q" in first.find_element("css selector", ".msg.user").text
    assert "→ add(" in first.find_element("css selector", ".msg.assistant").text
    assert "tools_used" not in first.text and "tools_used: 0.25" in last.text  # the emitted reward, on its call
    assert "status-ok" in added.get_attribute("class") and '{"a":2,"b":3}' in added.text and "result\n5" in added.text
    assert "status-error" in looked_up.get_attribute("class")
    assert "no table users" in looked_up.find_element("css selector", ".call-error").text
    assert "answer: 5 | no table users" in last.text
    assert "tokens" in first.text and "latency" in first.text
    retried = browser.find_elements("css selector", "#attempts tbody tr")
    assert len(retried) == 2 and "agent bug on qflaky" in retried[0].text and "succeeded" in retried[1].text
    assert "2 calls of this attempt" in retried[0].text  # its LLM calls, as the proxy recorded them
    shot(browser, "rollout")


def test_tasks_page_and_a_tasks_groups_side_by_side(browser, run: Run) -> None:
    open_page(browser, run, "#/tasks")
    rows = wait_for(browser, "#tasks tbody tr.link", lambda found: len(found) == 6)
    assert {row.find_elements("tag name", "td")[0].text for row in rows} == {"t0", "t1", "t2", "t3", "bad", "flaky"}
    shot(browser, "tasks")
    next(row for row in rows if row.find_elements("tag name", "td")[0].text == "flaky").click()
    groups = wait_for(browser, "#groups tr.group")
    assert len(groups) == 1 and len(groups[0].find_elements("css selector", "a.cell")) == 4
    assert [cell.text for cell in groups[0].find_elements("css selector", "a.cell")] == ["1"] * 4
    shot(browser, "task")
