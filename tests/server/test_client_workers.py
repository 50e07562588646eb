"""Client worker processes against a real server and a mock upstream, through the real openai client."""

from __future__ import annotations

from pathlib import Path

import pytest
import server_agents

from agentlightning.client import start_workers
from agentlightning.server import LightningServer, Settings
from agentlightning.testing import MockLLMServer


@pytest.fixture
def upstream():
    with MockLLMServer() as mock:
        yield mock


def test_workers_run_rollouts_with_server_token_ids(tmp_path: Path, upstream: MockLLMServer) -> None:
    settings = Settings(lease_seconds=5.0, rollout_timeout=30.0)
    with LightningServer(
        tmp_path / "s.db",
        upstream_url=upstream.base_url,
        model_name="mock-model",
        model_version="v1",
        settings=settings,
    ) as server:
        tasks = [{"id": f"t{i}", "question": f"q{i}", "calls": 2} for i in range(4)]
        ids = server.enqueue(tasks, group_size=2, group_id="step-0")
        pool = start_workers(server_agents.chat_agent, server.url, nworkers=2, spool_dir=str(tmp_path / "spool"))
        try:
            rollouts = server.wait(ids, timeout=60)
        finally:
            server.request_stop()
            assert pool.wait(20)
    assert [r.status for r in rollouts] == ["succeeded"] * 8
    tokenizer = upstream.tokenizer
    for rollout in rollouts:
        assert rollout.final_reward == 1.0 and rollout.model_version == "v1"
        assert rollout.group_id == f"step-0:{rollout.task_id}"
        assert len(rollout.llm_calls) == 2
        for index, call in enumerate(rollout.llm_calls):
            assert call.token_source == "server"
            assert call.metadata["model_version"] == "v1"
            assert call.completion_token_ids == tokenizer.encode(call.output["content"])
            assert call.output["content"] == f"echo: {rollout.task['question']} #{index}"
        assert any("answered" in line for line in rollout.logs)
