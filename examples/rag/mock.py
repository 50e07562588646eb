"""A rule-based stand-in for the model, for ``--dry-run`` and tests.

It first calls ``retrieve`` with the question, then answers. Each new episode on a question takes the next outcome
in a fixed cycle starting at a per-question offset: the gold answer in tags ('right', reward 1), a wrong answer in
tags ('wrong', reward 0.1) or the gold answer without tags ('untagged', reward 0). The outcome chosen at the first
request travels in the tool call id, so the answer request of the same episode knows it.
"""

from __future__ import annotations

import hashlib
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from agentlightning.testing import MockReply, MockRequest, MockToolCall

OUTCOMES = ("right", "wrong", "untagged")


def outcome(question: str, episode: int = 0) -> str:
    """The outcome of the ``episode``-th run (0-based) on ``question``."""
    offset = int(hashlib.sha256(question.encode()).hexdigest(), 16)
    return OUTCOMES[(offset + episode) % len(OUTCOMES)]


def mock_handler(tasks: Sequence[dict[str, Any]]) -> Callable[[MockRequest], MockReply]:
    """A handler answering the questions of ``tasks``."""
    answers = {task["question"]: task["answer"] for task in tasks}
    episodes: Counter[str] = Counter()
    lock = threading.Lock()

    def handle(request: MockRequest) -> MockReply:
        messages = request.messages
        question = next((str(m.get("content")) for m in messages if m.get("role") == "user"), "")
        tool_messages = [message for message in messages if message.get("role") == "tool"]
        if not tool_messages:
            with lock:
                kind = outcome(question, episodes[question])
                episodes[question] += 1
            call = MockToolCall(
                name="retrieve", arguments={"query": question}, id=f"call_{kind}_{uuid.uuid4().hex[:8]}"
            )
            return MockReply(tool_calls=[call])
        kind = str(tool_messages[0].get("tool_call_id", "")).split("_")[1]
        gold = answers.get(question, "unknown")
        if kind == "right":
            return MockReply(content=f"The paragraphs say it. <answer>{gold}</answer>")
        if kind == "wrong":
            return MockReply(content="<answer>Nobody knows</answer>")
        return MockReply(content=f"I believe it is {gold}.")

    return handle
