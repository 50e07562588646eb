"""Shared by the framework adapter tests: a rule-based mock model that remembers what it answered, so tests can
check that every captured LLM call carries exactly the token ids the server returned."""

from __future__ import annotations

import threading
from collections.abc import Callable

from agentlightning.testing import MockReply, MockRequest, MockTokenizer, render_chat_prompt
from agentlightning.types import Call, Rollout

Rule = Callable[[MockRequest], MockReply]


class RecordingModel:
    """A mock-server handler applying ``rule`` and keeping, per prompt, the token ids it returned."""

    def __init__(self, rule: Rule) -> None:
        self.rule = rule
        self._lock = threading.Lock()
        self.served: dict[tuple[int, ...], list[int]] = {}
        self.tokenizer = MockTokenizer()

    def __call__(self, request: MockRequest) -> MockReply:
        reply = self.rule(request)
        prompt = tuple(self.tokenizer.encode(render_chat_prompt(request.messages, request.tools)))
        with self._lock:
            self.served[prompt] = self.tokenizer.encode(reply.completion_text())
        return reply

    def assert_server_token_ids(self, call: Call, *, partial: bool = False) -> None:
        """``call`` has exactly the prompt and completion ids the server sent for its request (with ``partial``, a
        prefix of the completion ids: a stream left early)."""
        assert call.prompt_token_ids, f"call {call.sequence} ({call.role}) has no prompt token ids"
        with self._lock:
            expected = self.served.get(tuple(call.prompt_token_ids))
        assert expected is not None, f"call {call.sequence} ({call.role}): prompt ids match no request served"
        received = call.completion_token_ids or []
        assert (expected[: len(received)] if partial else expected) == received, (
            f"call {call.sequence} ({call.role}): completion ids differ"
        )
        assert call.token_source == "response"


def timeline(rollout: Rollout) -> list[tuple[str, str | None, str]]:
    """``(kind, role or tool name, status)`` of every call in order — the shape tests compare exactly."""
    assert rollout.status == "succeeded", f"rollout {rollout.status}: {rollout.error}"
    assert [call.sequence for call in rollout.calls] == sorted(call.sequence for call in rollout.calls)
    return [
        (call.kind, call.role if call.kind == "llm" else f"{call.role}:{call.name}", call.status)
        for call in rollout.calls
    ]
