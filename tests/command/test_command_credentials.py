"""A command agent run by a client's worker process on a server with a token gets its rollout's own LLM key, which
opens its proxy but none of the server's admin routes, and never the server's token from the environment (issue 36,
item 9: every lease handed the agent the server's admin token)."""

from __future__ import annotations

import json
from pathlib import Path

import command_agents
import pytest

from agentlightning.client import start_workers
from agentlightning.server import LightningServer
from agentlightning.testing import MockLLMServer


def test_command_agent_reaches_its_proxy_and_no_admin_route(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGL_SERVER_TOKEN", "s3cret")  # how users hand the token to agl client: workers inherit it
    with (
        MockLLMServer() as mock,
        LightningServer(tmp_path / "s.db", upstream_url=mock.base_url, token="s3cret") as server,
    ):
        [rid] = server.enqueue([{"q": 1}])
        pool = start_workers(
            command_agents.credential_probe, server.url, token="s3cret", nworkers=1, spool_dir=str(tmp_path / "spool")
        )
        try:
            [rollout] = server.wait([rid], timeout=60)
            stop_asked_by_agent = server.runtime.stop_requested
        finally:
            server.request_stop()
            assert pool.wait(20)
    assert rollout.status == "succeeded", rollout.error
    stdout = next(line for line in rollout.logs if line.startswith("stdout (tail): "))
    seen = json.loads(stdout.removeprefix("stdout (tail): ").splitlines()[0])
    assert seen["answer"] == "echo: hi"  # its own LLM endpoint answers its key
    assert seen["key"].startswith("agl-rollout-") and "s3cret" not in seen["key"]
    assert not seen["server_token_in_env"]
    assert (seen["stats"], seen["rollouts"], seen["stop"]) == (403, 403, 403)
    assert not stop_asked_by_agent
