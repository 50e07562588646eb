"""Builders for hand-made Rollout / Call records used by the LightningRL tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentlightning.testing import MockTokenizer, render_chat_prompt
from agentlightning.types import Call, Reward, Rollout


def llm(
    call_id: str,
    role: str | None = "writer",
    prompt: Sequence[int] | None = (1, 2, 3),
    completion: Sequence[int] | None = (4, 5),
    *,
    logprobs: Sequence[float] | None = None,
    source: str | None = "server",
    status: str = "ok",
    **fields: Any,
) -> Call:
    """An LLM call with token ids (None for a call whose ids were not recorded)."""
    return Call(
        call_id=call_id,
        kind="llm",
        role=role,
        prompt_token_ids=None if prompt is None else list(prompt),
        completion_token_ids=None if completion is None else list(completion),
        completion_logprobs=None if logprobs is None else list(logprobs),
        token_source=source if prompt is not None or completion is not None else None,
        status=status,
        **fields,
    )


def tool(call_id: str, parent: str | None, status: str = "ok", name: str = "search") -> Call:
    """A tool call requested by the LLM call ``parent``."""
    return Call(call_id=call_id, kind="tool", name=name, parent_call_id=parent, status=status)


def rollout(
    rollout_id: str,
    reward: float | None,
    calls: Sequence[Call],
    *,
    task_id: str | None = "t1",
    status: str = "succeeded",
    rewards: Sequence[Reward] = (),
    **fields: Any,
) -> Rollout:
    """A finished rollout whose calls are numbered in the given order."""
    numbered = [
        call.model_copy(update={"sequence": index, "rollout_id": rollout_id}) for index, call in enumerate(calls)
    ]
    return Rollout(
        rollout_id=rollout_id,
        task_id=task_id,
        status=status,
        calls=numbered,
        rewards=list(rewards),
        final_reward=reward,
        **fields,
    )


def by_id(items: Sequence[Any], attribute: str = "call_id") -> dict[Any, Any]:
    """Index records by an attribute."""
    return {getattr(item, attribute): item for item in items}


class ChatTokenizer(MockTokenizer):
    """The mock server's byte tokenizer plus the chat template it renders prompts with."""

    def apply_chat_template(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        tokenize: bool = True,
    ) -> list[int]:
        assert add_generation_prompt and tokenize
        return self.encode(render_chat_prompt(messages, tools))
