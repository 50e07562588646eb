"""The proxy served LLM calls of a rollout that in-process capture missed while it recorded others (a client nothing
instruments next to the openai client): the user is told once per run, each rollout says so in its diagnostics, the
missed calls are marked and counted in agl.train's ``calls/proxy_only`` metric. Agents captured in full say nothing."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import raw_http_agents
from agentlightning.trainers.reporting import rollout_metrics

import agentlightning as agl
from agentlightning.client import start_workers
from agentlightning.server import LightningServer
from agentlightning.testing import MockLLMServer

GAP = "in-process capture recorded only"


def _through_the_proxy(tmp_path: Path, agent: agl.RolloutAgent, upstream: MockLLMServer) -> list[agl.Rollout]:
    """Three rollouts of ``agent`` by a client worker process, its calls sent to the server's per-rollout proxy."""
    with LightningServer(tmp_path / "s.db", upstream_url=upstream.base_url, model_name="mock-model") as server:
        ids = server.enqueue([{"id": f"t{i}", "question": f"question {i}"} for i in range(3)])
        pool = start_workers(agent, server.url, nworkers=1, spool_dir=str(tmp_path / "spool"))
        try:
            rollouts = server.wait(ids, timeout=60)
        finally:
            server.request_stop()
            assert pool.wait(20)
    return rollouts


def test_calls_that_bypass_capture_are_reported_once_per_run(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    with MockLLMServer(token_ids=True) as upstream:
        rollouts = _through_the_proxy(tmp_path, raw_http_agents.half_captured_agent, upstream)
        assert len(upstream.requests) == 6
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and GAP in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    message = warnings[0].getMessage()
    assert "the proxy served 2 LLM calls but in-process capture recorded only 1" in message
    assert any(message.startswith(f"rollout {r.rollout_id}:") for r in rollouts), message
    assert "does not instrument" in message and "docs/capture.md" in message and "once per run" in message
    for rollout in rollouts:
        assert rollout.status == "succeeded" and rollout.final_reward == 1.0, rollout.error
        first, second = rollout.llm_calls  # both kept: the missed one from the proxy's record
        assert "proxy_call_id" in first.metadata and not first.metadata.get("missed_by_capture")
        assert second.metadata["missed_by_capture"] is True and second.metadata["captured_by"] == "proxy"
        assert second.completion_token_ids == upstream.tokenizer.encode(second.output["content"])
        assert any(GAP in note for note in rollout.diagnostics), rollout.diagnostics
    assert rollout_metrics(rollouts, "v0", lambda r: True)["calls/proxy_only"] == 3.0


def test_a_fully_captured_agent_is_not_reported(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    with MockLLMServer(token_ids=True) as upstream:
        rollouts = _through_the_proxy(tmp_path, raw_http_agents.openai_agent, upstream)
        assert len(upstream.requests) == 6
    assert not [r for r in caplog.records if GAP in r.getMessage()]
    for rollout in rollouts:
        assert rollout.status == "succeeded" and rollout.final_reward == 1.0, rollout.error
        assert len(rollout.llm_calls) == 2
        assert all("proxy_call_id" in call.metadata for call in rollout.llm_calls)
        assert not any(GAP in note for note in rollout.diagnostics), rollout.diagnostics
    assert rollout_metrics(rollouts, "v0", lambda r: True)["calls/proxy_only"] == 0.0


def test_agl_train_counts_the_missed_calls_per_step(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """One real training step (tiny model, HF backend behind the proxy, worker processes): the warning once for the
    run, and the step's ``calls/proxy_only`` counts one missed call per rollout."""
    pytest.importorskip("torch")
    from agentlightning.trainers.models import tiny_model

    model, tokenizer = tiny_model(seed=1)
    tasks = [{"id": f"t{i}", "question": f"What is {i} + {i}?"} for i in range(2)]
    result = agl.train(
        raw_http_agents.half_captured_agent,
        tasks,
        model=model,
        tokenizer=tokenizer,
        group_size=2,
        tasks_per_step=2,
        max_steps=1,
        micro_batch_size=4,
        max_completion_length=8,
        output_dir=tmp_path / "run",
        nworkers=2,
        progress=False,
        save_model=False,
        allow_no_update=True,  # the tiny model's rewards may not differ within a group; the metrics are the point
    )
    [step] = result.history
    assert step["rollouts"] == 4 and step["llm_calls"] == 8
    assert step["calls/proxy_only"] == 4
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and GAP in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "the proxy served 2 LLM calls but in-process capture recorded only 1" in warnings[0].getMessage()
