"""Naming agents so spawned worker processes can import them."""

from __future__ import annotations

import pytest
import server_agents

import agentlightning as agl
from agentlightning.client._worker import agent_ref, load_agent


def _plain(task, llm):  # noqa: ANN001, ANN202
    return 1.0


configured = agl.rollout(_plain, roles=["writer"])


def test_decorated_and_configured_agents_keep_their_options() -> None:
    assert agent_ref(server_agents.chat_agent) == "server_agents:chat_agent"
    ref = agent_ref(configured)
    assert ref.endswith(":configured")
    assert load_agent(ref).roles == ["writer"]
    assert load_agent(agent_ref(_plain)).func is _plain


def test_unimportable_agents_are_refused_with_a_reason() -> None:
    def local(task, llm):  # noqa: ANN001, ANN202
        return 0.0

    with pytest.raises(ValueError, match="module level"):
        agent_ref(local)
    with pytest.raises(ValueError, match="module level"):
        agent_ref(agl.rollout(lambda task, llm: 0.0))
    with pytest.raises(ValueError, match="roles/reward"):
        agent_ref(agl.rollout(_plain, reward=lambda task, output: 1.0))
    with pytest.raises(ValueError, match="no attribute"):
        load_agent("server_agents:missing")
    with pytest.raises(ValueError, match="look like"):
        load_agent("nonsense")
