"""Transition extraction: roles, token ids and their sources, rollout policies, intermediate rewards, stats."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest
from rl_records import ChatTokenizer, llm, rollout, tool

import agentlightning as agl
from agentlightning.rl import extract_transitions, transitions
from agentlightning.server.store import SQLiteStore
from agentlightning.types import Reward, Transition


def test_agl_transitions_is_the_rl_function() -> None:
    assert agl.transitions is transitions


def test_one_transition_per_llm_call_with_all_fields() -> None:
    ro = rollout(
        "r1",
        1.0,
        [
            llm(
                "a", prompt=[1, 2], completion=[3, 4, 5], logprobs=[-0.1, -0.2, -0.3], metadata={"model_version": "v7"}
            ),
            tool("t", parent="a"),
            llm("b", role="critic", prompt=[9], completion=[8], source="response"),
        ],
        group_id="g1",
        model_version="v6",
    )
    first, second = transitions([ro])
    assert first.model_dump(exclude={"schema_version"}) == {
        "rollout_id": "r1",
        "task_id": "t1",
        "group_id": "g1",
        "index": 0,
        "call_id": "a",
        "role": "writer",
        "prompt_token_ids": [1, 2],
        "completion_token_ids": [3, 4, 5],
        "completion_logprobs": [-0.1, -0.2, -0.3],
        "token_source": "server",
        "reward": 1.0,
        "advantage": None,
        "weight": 1.0,
        "model_version": "v7",
    }
    assert (second.index, second.call_id, second.role, second.token_source) == (1, "b", "critic", "response")
    assert second.model_version == "v6"  # the call did not name one: the rollout's
    # Records built without validation still round-trip through JSON.
    assert Transition.model_validate_json(first.model_dump_json()) == first


def test_group_defaults_to_task_id() -> None:
    (t,) = transitions([rollout("r1", 1.0, [llm("a")], task_id="task-9")])
    assert t.group_id == "task-9"
    (t,) = transitions([rollout("r1", 1.0, [llm("a")], task_id=None)])
    assert t.group_id is None


def test_role_selection_exact_glob_and_all() -> None:
    calls = [llm("a", role="sql_writer"), llm("b", role="sql_checker"), llm("c", role="critic"), llm("d", role=None)]
    ro = rollout("r1", 1.0, calls)
    assert [t.call_id for t in transitions([ro])] == ["a", "b", "c", "d"]
    assert [t.call_id for t in transitions([ro], roles=["critic"])] == ["c"]
    assert [t.call_id for t in transitions([ro], roles=["sql_*"])] == ["a", "b"]
    assert [t.call_id for t in transitions([ro], roles=["sql_checker", "crit*"])] == ["b", "c"]


def test_rollout_trainable_roles_are_the_default_and_explicit_roles_override() -> None:
    ro = rollout("r1", 1.0, [llm("a", role="writer"), llm("b", role="critic")], trainable_roles=["writer"])
    assert [t.call_id for t in transitions([ro])] == ["a"]
    assert [t.call_id for t in transitions([ro], roles=["critic"])] == ["b"]


@pytest.mark.parametrize("roles", ["writer", [], [""], ["writer", 3]])
def test_bad_roles_argument(roles: object) -> None:
    with pytest.raises(ValueError, match="roles must be"):
        transitions([rollout("r1", 1.0, [llm("a")])], roles=roles)  # type: ignore[arg-type]


def test_unmatched_role_pattern_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    ro = rollout("r1", 1.0, [llm("a", role="writer"), llm("b", role=None)])
    extraction = extract_transitions([ro], roles=["writer", "rewriter"])
    assert extraction.stats.unmatched_roles == ["rewriter"]
    with caplog.at_level(logging.WARNING):
        assert transitions([ro], roles=["nobody"]) == []
    text = caplog.text
    assert "roles ['nobody'] matched no LLM call; roles seen: ['writer'] (1 calls had no role)" in text
    assert "no transitions were produced from 1 rollouts" in text


def test_calls_without_token_ids_are_skipped_loudly(caplog: pytest.LogCaptureFixture) -> None:
    ro = rollout("r1", 1.0, [llm("a", prompt=None, completion=None), llm("b")])
    with caplog.at_level(logging.WARNING):
        found = transitions([ro])
    assert [t.call_id for t in found] == ["b"]
    assert "1 LLM calls of selected roles skipped: no token ids recorded and no tokenizer given" in caplog.text
    stats = extract_transitions([ro]).stats
    assert sum(stats.calls_skipped.values()) == 1


def test_retokenization_is_an_explicit_marked_fallback(caplog: pytest.LogCaptureFixture) -> None:
    tokenizer = ChatTokenizer()
    messages = [{"role": "user", "content": "2+2?"}]
    tools = [{"type": "function", "function": {"name": "add"}}]
    text_call = llm(
        "a",
        prompt=None,
        completion=None,
        logprobs=[-1.0],
        input=messages,
        tools=tools,
        output={"content": "4", "tool_calls": [], "finish_reason": "stop"},
    )
    half_recorded = llm(
        "b",
        prompt=[7, 7],
        completion=None,
        source="response",
        input=messages,
        output={"content": "ok", "finish_reason": "length"},
    )
    tool_calling = llm("c", prompt=None, completion=None, input=messages, output={"tool_calls": [{"id": "x"}]})
    ro = rollout("r1", 1.0, [text_call, half_recorded, tool_calling])
    with caplog.at_level(logging.WARNING):
        found = transitions([ro], tokenizer=tokenizer)
    a, b = found
    assert a.prompt_token_ids == tokenizer.apply_chat_template(messages, tools)
    assert a.completion_token_ids == tokenizer.encode("4") + [tokenizer.eos_token_id]  # the model stopped itself
    assert (a.token_source, a.completion_logprobs) == ("retokenized", None)  # recorded logprobs no longer align
    assert b.prompt_token_ids == [7, 7]  # recorded ids are kept, only the missing side is rebuilt
    assert (b.completion_token_ids, b.token_source) == (tokenizer.encode("ok"), "retokenized")
    assert "2 calls had no recorded token ids and were re-tokenized from text" in caplog.text
    assert "re-tokenization impossible: the output holds tool calls" in caplog.text


def test_retokenization_needs_a_chat_template_for_messages() -> None:
    from agentlightning.testing import MockTokenizer

    chat = llm("a", prompt=None, completion=None, input=[{"role": "user", "content": "hi"}], output="yo")
    text = llm("b", prompt=None, completion=None, input="plain prompt", output="yo")
    extraction = extract_transitions([rollout("r1", 1.0, [chat, text])], tokenizer=MockTokenizer())
    assert [t.call_id for t in extraction.transitions] == ["b"]
    assert extraction.transitions[0].prompt_token_ids == MockTokenizer().encode("plain prompt")
    assert list(extraction.stats.calls_skipped) == [
        "no token ids recorded and re-tokenization impossible: the tokenizer has no apply_chat_template for the "
        "chat messages"
    ]


def test_a_response_recorded_by_client_and_proxy_is_merged_once_by_the_store(tmp_path: Path) -> None:
    """The store joins the proxy's record into the client's when the result arrives; transitions read the calls as
    stored: one transition per response, with the proxy's ids and the client's role."""
    store = SQLiteStore(tmp_path / "store.db")
    try:
        info = store.add_dataset([{"id": "t"}])
        [rid] = store.enqueue(store.dataset_tasks(info.dataset_id))
        lease = store.dequeue("w", 10.0)
        assert lease is not None
        proxy = llm("proxy", None, [1, 2], [3], rollout_id=rid, response_id="resp-1", metadata={"model_version": "v7"})
        store.record_proxy_call(proxy.model_dump(mode="json"), attempt=1)
        client = llm("client", role="writer", prompt=[5], completion=[6], source="response", response_id="resp-1")
        other = llm("other", role="writer", prompt=[7], completion=[8], source="response", response_id="resp-2")
        result = rollout(rid, 1.0, [client, other], task_id=lease.task_id)
        assert store.complete(rid, 1, "w", result).accepted
        stored = store.get_rollout(rid)
    finally:
        store.close()
    assert stored is not None and [call.call_id for call in stored.llm_calls] == ["client", "other"]
    extraction = extract_transitions([stored])
    first, second = extraction.transitions
    assert (first.call_id, first.role, first.token_source, first.model_version) == ("client", "writer", "server", "v7")
    assert (first.prompt_token_ids, first.completion_token_ids) == ([1, 2], [3])
    assert (second.call_id, second.token_source, second.prompt_token_ids) == ("other", "response", [7])


def test_failed_rollout_policy() -> None:
    calls = [llm("a")]
    failed_unrewarded = rollout("f1", None, calls, status="failed")
    failed_rewarded = rollout("f2", 0.0, calls, status="failed")
    timed_out = rollout("t1", None, calls, status="timeout")
    ok = rollout("ok", 1.0, calls)
    everything = [failed_unrewarded, failed_rewarded, timed_out, ok]

    default = extract_transitions(everything)
    assert [t.rollout_id for t in default.transitions] == ["f2", "ok"]
    assert default.stats.rollouts_skipped == {
        "status 'failed' without a final reward": 1,
        "status 'timeout' without a final reward": 1,
    }
    assert [t.rollout_id for t in transitions(everything, failed="exclude")] == ["ok"]
    # 'include' keeps failed rollouts; a missing reward needs missing_reward, or the rollout is skipped.
    assert [t.rollout_id for t in transitions(everything, failed="include")] == ["f2", "ok"]
    found = transitions(everything, failed="include", missing_reward=-1.0)
    assert [(t.rollout_id, t.reward) for t in found] == [("f1", -1.0), ("f2", 0.0), ("t1", -1.0), ("ok", 1.0)]
    assert failed_unrewarded.final_reward is None  # the input record is not modified
    with pytest.raises(ValueError, match="failed='sometimes' is not a policy"):
        transitions(everything, failed="sometimes")  # type: ignore[arg-type]


def test_unfinished_and_unrewarded_rollouts_are_skipped_with_reasons() -> None:
    calls = [llm("a")]
    rollouts = [
        rollout("q", None, calls, status="queued"),
        rollout("run", None, calls, status="running"),
        rollout("c", 1.0, calls, status="cancelled"),
        rollout("none", None, calls),
        rollout("nocalls", 1.0, [tool("x", None)]),
    ]
    stats = extract_transitions(rollouts).stats
    assert (stats.rollouts_seen, stats.rollouts_used, stats.transitions) == (5, 0, 0)
    assert stats.as_dict() == {
        "rollouts_seen": 5,
        "rollouts_used": 0,
        "rollouts_skipped": 5,
        "calls_skipped": 0,
        "calls_not_selected": 0,
        "calls_retokenized": 0,
        "logprobs_dropped": 0,
        "rewards_unassigned": 0,
        "transitions": 0,
    }
    assert stats.rollouts_skipped == {
        "status 'queued' (not a finished episode)": 1,
        "status 'running' (not a finished episode)": 1,
        "status 'cancelled' (not a finished episode)": 1,
        "no final reward (pass missing_reward=... to use a default)": 1,
        "no LLM call of a selected role with token ids": 1,
    }
    assert [t.reward for t in transitions(rollouts, missing_reward=0.5)] == [0.5]


def test_intermediate_rewards_add_to_the_credited_return() -> None:
    rewards = [
        Reward(value=0.25, call_id="a", source="emitted"),
        Reward(value=0.5, call_id="a", source="air", name="stored"),
        Reward(value=-1.0, call_id="b", source="emitted"),
        Reward(value=3.0, call_id=None, source="emitted"),  # episode-level: not spread over calls
        Reward(value=2.0, call_id=None, source="final"),
        Reward(value=7.0, call_id="x", source="emitted"),  # on a call of a role not selected
    ]
    ro = rollout("r1", 2.0, [llm("a"), llm("x", role="critic"), llm("b")], rewards=rewards)
    extraction = extract_transitions([ro], roles=["writer"])
    assert [t.reward for t in extraction.transitions] == [2.75, 1.0]
    assert extraction.stats.rewards_unassigned == 1
    assert [t.reward for t in transitions([ro], roles=["writer"], include_emitted=False)] == [2.0, 2.0]
    assert [t.reward for t in transitions([ro], roles=["writer"], credit="last")] == [0.75, 1.0]


def test_mismatched_logprobs_and_empty_completions() -> None:
    ro = rollout(
        "r1",
        1.0,
        [llm("a", completion=[1, 2], logprobs=[-0.5]), llm("b", completion=[], status="error"), llm("c")],
    )
    extraction = extract_transitions([ro])
    assert [(t.call_id, t.completion_logprobs) for t in extraction.transitions] == [("a", None), ("c", None)]
    assert extraction.stats.logprobs_dropped == 1
    assert extraction.stats.calls_skipped == {"empty completion (the call ended in an error)": 1}


def test_non_finite_rewards_name_the_rollout() -> None:
    with pytest.raises(ValueError, match="final reward of rollout 'r1'.*inf"):
        transitions([rollout("r1", math.inf, [llm("a")])])
    with pytest.raises(ValueError, match="missing_reward"):
        transitions([rollout("r1", None, [llm("a")])], missing_reward=math.nan)
    with pytest.raises(TypeError, match="expects Rollout records, got dict"):
        transitions([{"rollout_id": "r1"}])  # type: ignore[list-item]
    ro = rollout("r1", 1.0, [llm("a")])
    with pytest.raises(TypeError, match="got a single Rollout"):
        transitions(ro)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rollout 'r1' was given twice"):
        transitions([ro, ro])


def test_rollouts_from_json_give_the_same_transitions() -> None:
    ro = rollout("r1", 1.0, [llm("a", logprobs=[-0.1, -0.2]), tool("t", "a", status="error")], group_id="g")
    again = type(ro).model_validate_json(ro.model_dump_json())
    assert transitions([again]) == transitions([ro])
