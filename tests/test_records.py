"""Records: JSON round-trip of captured data, schema versions, documented fields, reward validation."""

from __future__ import annotations

import json
import math

import openai
import pytest
from pydantic import BaseModel, ValidationError

import agentlightning as agl
from agentlightning.testing import MockLLMServer, MockReply, MockToolCall
from agentlightning.types import SCHEMA_VERSION, ErrorInfo, Record, merge_records, role_matches, unmatched_patterns

RECORDS: list[type[BaseModel]] = [agl.Call, agl.Reward, agl.Rollout, agl.Transition, agl.LLM, ErrorInfo]


@agl.rollout(roles=["writer"])
def tool_agent(task: dict, llm: agl.LLM) -> float:
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    with agl.role("writer"):
        first = client.chat.completions.create(
            model=llm.model,
            messages=[{"role": "user", "content": task["q"]}],
            logprobs=True,
            tools=[{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}],
        )
        agl.emit_reward(0.25, name="format")
        client.chat.completions.create(
            model=llm.model,
            messages=[
                {"role": "user", "content": task["q"]},
                first.choices[0].message,
                {"role": "tool", "tool_call_id": first.choices[0].message.tool_calls[0].id, "content": "3"},
            ],
        )
    return 1.0


def test_captured_rollout_round_trips_through_json() -> None:
    replies = [MockReply(tool_calls=[MockToolCall("add", {"a": 1, "b": 2})]), MockReply(content="3")]
    with MockLLMServer(replies=replies, token_ids=True) as server:
        (rollout,) = agl.run(tool_agent, [{"id": "t1", "q": "1+2?"}], llm=server.llm())
    assert rollout.status == "succeeded" and len(rollout.calls) == 2
    text = rollout.model_dump_json()
    restored = agl.Rollout.model_validate_json(text)
    assert restored == rollout
    assert restored.calls[0].completion_token_ids == rollout.calls[0].completion_token_ids
    assert restored.calls[0].completion_logprobs == rollout.calls[0].completion_logprobs
    assert restored.rewards[0].call_id == restored.calls[0].call_id and restored.rewards[0].name == "format"
    assert restored.calls[1].input[1]["tool_calls"][0]["function"]["name"] == "add"
    data = json.loads(text)
    assert data["schema_version"] == SCHEMA_VERSION and data["calls"][0]["schema_version"] == SCHEMA_VERSION
    assert restored.calls[0].latency is not None and restored.calls[0].latency >= 0


def test_transition_and_llm_round_trip() -> None:
    transition = agl.Transition(
        rollout_id="ro-1",
        index=0,
        prompt_token_ids=[1, 2],
        completion_token_ids=[3],
        completion_logprobs=[-0.5],
        reward=1.0,
        advantage=0.5,
        token_source="server",
    )
    assert agl.Transition.model_validate_json(transition.model_dump_json()) == transition
    llm = agl.LLM(base_url="http://127.0.0.1:1/v1", model="m", sampling_parameters={"temperature": 0.7})
    assert agl.LLM.model_validate_json(llm.model_dump_json()) == llm


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.__name__)
def test_every_field_is_documented_and_versioned(record: type[BaseModel]) -> None:
    assert issubclass(record, Record)
    for name, field in record.model_fields.items():
        assert field.description, f"{record.__name__}.{name} has no description"


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, "1.0", True, None])
def test_reward_must_be_finite_number(value: object) -> None:
    with pytest.raises(ValidationError, match=r"Reward\.value: reward must be a finite number"):
        agl.Reward(value=value)


def test_unknown_fields_from_newer_versions_are_ignored() -> None:
    call = agl.Call.model_validate({"schema_version": 2, "kind": "llm", "future_field": 1})
    assert call.kind == "llm" and not hasattr(call, "future_field")


def test_merge_records_keeps_the_best_token_ids_and_the_named_role() -> None:
    client = agl.Call(role="writer", prompt_token_ids=[5], completion_token_ids=[6], token_source="response")
    proxy = agl.Call(
        prompt_token_ids=[1, 2],
        completion_token_ids=[3],
        completion_logprobs=[-0.5],
        token_source="server",
        response_id="resp-1",
        metadata={"model_version": "v7", "policy": "p"},
    )
    merge_records(client, proxy)
    assert (client.prompt_token_ids, client.completion_token_ids, client.completion_logprobs) == ([1, 2], [3], [-0.5])
    assert (client.token_source, client.role, client.response_id) == ("server", "writer", "resp-1")
    assert client.metadata == {"model_version": "v7", "policy": "p"}
    without_ids = agl.Call(role="critic", token_source=None)
    merge_records(proxy, without_ids)  # a record without ids completes the role only
    assert (proxy.prompt_token_ids, proxy.token_source, proxy.role) == ([1, 2], "server", "critic")


def test_role_matches_names_and_globs() -> None:
    assert role_matches("writer", None) and role_matches(None, None)
    assert role_matches("writer", ["writer"]) and role_matches("sql-writer", ["sql-*"])
    assert not role_matches(None, ["*"]) and not role_matches("critic", ["writer", "w*"])
    assert unmatched_patterns(["w*", "critic"], ["writer", None]) == ["critic"]
