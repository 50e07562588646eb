"""A rule-based stand-in for the model, for ``--dry-run`` and tests: it plays the number game by bisection from
the host's replies. Bisection needs about log2(range) guesses, so games with a wide range and few guesses are lost:
both rewards occur."""

from __future__ import annotations

import re

from agentlightning.testing import MockReply, MockRequest

_RANGE = re.compile(r"between (-?\d+) and (-?\d+)")
_GUESS = re.compile(r"GUESS:\s*(-?\d+)")


def handle(request: MockRequest) -> MockReply:
    """Next guess: bisect the interval left by the 'higher' / 'lower' answers so far."""
    messages = request.messages
    found = _RANGE.search(str(messages[1].get("content", ""))) if len(messages) > 1 else None
    low, high = (int(found.group(1)), int(found.group(2))) if found else (1, 100)
    for reply, answer in zip(messages[2::2], messages[3::2], strict=False):
        guess = _GUESS.search(str(reply.get("content", "")))
        if guess is None:
            continue
        value = int(guess.group(1))
        verdict = str(answer.get("content", ""))
        if verdict.startswith("higher"):
            low = max(low, value + 1)
        elif verdict.startswith("lower"):
            high = min(high, value - 1)
    guess = (low + high) // 2
    return MockReply(content=f"The secret is in [{low}, {high}], so I take the middle. GUESS: {guess}")
