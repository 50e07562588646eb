"""End to end: a real agent (real openai client) against the mock server, captured, then shaped for training."""

from __future__ import annotations

import openai
import pytest

import agentlightning as agl
from agentlightning.rl import FormatRule, compute_advantages, pack
from agentlightning.testing import MockLLMServer, MockReply, MockRequest, render_chat_prompt


def handler(request: MockRequest) -> MockReply:
    text = request.messages[-1]["content"]
    if text.startswith("check"):
        return MockReply(content="fine")
    seed = int(text.split()[-1])
    return MockReply(content=f"ANSWER: {seed}" if seed % 2 == 0 else f"maybe {seed}")


@agl.rollout(roles=["writer"])
def agent(task: dict, llm: agl.LLM) -> float:
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key)
    with agl.role("writer"):
        answer = (
            client.chat.completions.create(
                model=llm.model,
                messages=[{"role": "user", "content": f"{task['question']} {task['seed']}"}],
                logprobs=True,
            )
            .choices[0]
            .message.content
        )
    with agl.role("critic"):
        client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": f"check {answer}"}])
    return 1.0 if answer.startswith("ANSWER") else 0.0


def test_captured_rollouts_become_a_training_batch() -> None:
    tasks = [{"id": f"q{q}", "question": f"question {q}", "seed": seed} for q in range(2) for seed in range(4)]
    with MockLLMServer(handler=handler, token_ids=True) as server:
        rollouts = agl.run(
            agent, tasks, llm=agl.LLM(base_url=server.base_url, model="m", model_version="v3"), n_workers=2
        )
        tokenizer = server.tokenizer
    assert [r.status for r in rollouts] == ["succeeded"] * 8

    found = agl.transitions(rollouts, air=FormatRule("^ANSWER:", failed=-0.5))
    assert len(found) == 8 and {t.role for t in found} == {"writer"}  # the critic is context only
    for transition, task in zip(found, tasks, strict=True):
        content = f"{task['question']} {task['seed']}"
        prompt = render_chat_prompt([{"role": "user", "content": content}])
        assert transition.prompt_token_ids == tokenizer.encode(prompt)
        reply = f"ANSWER: {task['seed']}" if task["seed"] % 2 == 0 else f"maybe {task['seed']}"
        assert tokenizer.decode(transition.completion_token_ids) == reply
        assert transition.completion_logprobs is not None
        assert len(transition.completion_logprobs) == len(transition.completion_token_ids)
        assert transition.token_source == "response"
        assert (transition.model_version, transition.group_id) == ("v3", task["id"])
        assert transition.reward == (1.0 if task["seed"] % 2 == 0 else -0.5)  # R plus the format penalty

    compute_advantages(found, "grpo", eps=0.0)
    # each group: rewards [1, -0.5, 1, -0.5] -> mean 0.25, sample std sqrt(0.75)
    assert [t.advantage for t in found] == pytest.approx([0.75 / 0.75**0.5, -0.75 / 0.75**0.5] * 4)
    batch = pack(found, pad_token_id=tokenizer.pad_token_id)
    assert len(batch) == 8 and batch.old_logprobs is not None
    assert batch.completion_mask.sum(dim=1).tolist() == [len(t.completion_token_ids) for t in found]
    assert batch.prompt_ids[:, -1].tolist() == [t.prompt_token_ids[-1] for t in found]  # left padding
