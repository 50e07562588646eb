"""A rule-based stand-in for the model, for ``--dry-run`` and tests.

Each new episode on a question takes the next outcome in a fixed cycle starting at a per-question offset: compute
the gold answer with the calculator and state it ('right', reward 1), send the calculator a bad expression and
then guess wrong ('tool_error', reward 0 and a failed tool call for AIR), or answer the gold number in a loose
format without the calculator ('formatted': ``$1,234.0``, reward 1). The outcome chosen at the first request
travels in the tool call id, so the follow-up request of the same episode knows it.
"""

from __future__ import annotations

import hashlib
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from agentlightning.testing import MockReply, MockRequest, MockToolCall

OUTCOMES = ("right", "tool_error", "formatted")
WRONG_ANSWER = "7919"


def outcome(question: str, episode: int = 0) -> str:
    """The outcome of the ``episode``-th run (0-based) on ``question``."""
    offset = int(hashlib.sha256(question.encode()).hexdigest(), 16)
    return OUTCOMES[(offset + episode) % len(OUTCOMES)]


def mock_handler(tasks: Sequence[dict[str, Any]]) -> Callable[[MockRequest], MockReply]:
    """A handler answering the questions of ``tasks``."""
    answers = {task["question"]: str(task["answer"]) for task in tasks}
    episodes: Counter[str] = Counter()
    lock = threading.Lock()

    def handle(request: MockRequest) -> MockReply:
        messages = request.messages
        question = next((str(m.get("content")) for m in messages if m.get("role") == "user"), "")
        gold = answers.get(question, "0")
        tool_messages = [message for message in messages if message.get("role") == "tool"]
        if not tool_messages:
            with lock:
                kind = outcome(question, episodes[question])
                episodes[question] += 1
            if kind == "formatted":
                number = f"${float(gold):,.1f}" if _is_number(gold) else gold
                return MockReply(content=f"Adding it all up gives {number}.\n### ANSWER: {number} ###")
            expression = f"{gold} * 1" if kind == "right" and _is_number(gold) else "two plus three"
            call_id = f"call_{kind}_{uuid.uuid4().hex[:8]}"
            return MockReply(
                tool_calls=[MockToolCall(name="calculator", arguments={"expression": expression}, id=call_id)]
            )
        if str(tool_messages[0].get("tool_call_id", "")).startswith("call_right_"):
            return MockReply(content=f"The calculator confirms it.\n### ANSWER: {gold} ###")
        return MockReply(content=f"The calculator failed, so I guess.\n### ANSWER: {WRONG_ANSWER} ###")

    return handle


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
