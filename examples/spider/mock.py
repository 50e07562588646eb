"""A rule-based stand-in for the model, for ``--dry-run`` and tests.

It plays the three roles from their system prompts and knows the gold SQL of the given tasks. Each new episode
(writer request) on a question takes the next outcome in a fixed cycle that starts at a per-question offset: write
the gold query at once ('right'), write a wrong one that the checker rejects and the rewriter fixes ('fixed'), or
keep rewriting it into malformed SQL ('broken'). So rewards of 1 and 0 occur within one GRPO group, every role
speaks, and a failing predicted query is exercised; the run is deterministic for a given order of requests.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from agentlightning.testing import MockReply, MockRequest
from examples.spider.sql_agent import CORRECT_MARKER

WRONG_SQL = "SELECT 1 WHERE 0"
FIXABLE_SQL = "SELECT 2 WHERE 0"
OUTCOMES = ("right", "fixed", "broken")
BROKEN_SQL = "SELEC name FROM"
_QUESTION = re.compile(r"^Question: (.*)$", re.MULTILINE)
_SQL = re.compile(r"Query:\n```sql\n(.*?)\n```", re.DOTALL)


def outcome(question: str, episode: int = 0) -> str:
    """'right', 'fixed' or 'broken': how the mock handles the ``episode``-th run (0-based) on ``question``."""
    offset = int(hashlib.sha256(question.encode()).hexdigest(), 16)
    return OUTCOMES[(offset + episode) % len(OUTCOMES)]


def mock_handler(tasks: Sequence[dict[str, Any]]) -> Callable[[MockRequest], MockReply]:
    """A handler for the writer, checker and rewriter prompts of :mod:`examples.spider.sql_agent`."""
    gold_by_question = {task["question"]: task["gold_sql"] for task in tasks}
    episodes: Counter[str] = Counter()
    lock = threading.Lock()

    def handle(request: MockRequest) -> MockReply:
        system = next((str(m.get("content")) for m in request.messages if m.get("role") == "system"), "")
        user = request.last_user_text
        found = _QUESTION.search(user)
        question = found.group(1).strip() if found else ""
        gold = gold_by_question.get(question, WRONG_SQL)
        if system.startswith("You are the SQL writer"):
            with lock:
                kind = outcome(question, episodes[question])
                episodes[question] += 1
            sql = {"right": gold, "fixed": FIXABLE_SQL, "broken": WRONG_SQL}[kind]
            return MockReply(content=f"```sql\n{sql}\n```")
        if system.startswith("You are the SQL checker"):
            sql = _SQL.search(user)
            if sql and sql.group(1).strip() == gold.strip():
                return MockReply(content=f"{CORRECT_MARKER}.")
            return MockReply(content="The query does not answer the question: it returns the wrong rows.")
        if system.startswith("You are the SQL rewriter"):
            sql = _SQL.search(user)
            fixable = sql is not None and sql.group(1).strip() == FIXABLE_SQL
            return MockReply(content=f"```sql\n{gold if fixable else BROKEN_SQL}\n```")
        return MockReply(content=f"unexpected prompt: {system[:60]!r}", status=400, error_message="unknown prompt")

    return handle
