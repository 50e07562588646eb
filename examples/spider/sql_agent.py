"""A Spider text-to-SQL agent in LangChain: writer, checker and rewriter steps sharing one chat model.

The loop: the *writer* drafts a query from the question and the schema; the query is executed; the *checker* reads
the schema, the query and its execution result (or error) and either approves it or explains what is wrong; the
*rewriter* produces a corrected query from that feedback; check and rewrite repeat up to ``max_turns`` times and
the last query is the answer. Each step is a LangChain runnable named with ``with_config(run_name=...)``, which is
all Agent Lightning's LangChain adapter needs to attribute every LLM call to its role.

Only the writer and the rewriter are trained (``roles=["writer", "rewriter"]``); the checker's calls are context.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_openai import ChatOpenAI

import agentlightning as agl
from examples.spider.data import schema_text
from examples.spider.reward import QueryError, execution_match, run_query

logger = logging.getLogger(__name__)

WRITER_SYSTEM = (
    "You are the SQL writer. You translate a question about a SQLite database into one SQLite query.\n"
    "Database schema:\n{schema}\n\n"
    "Reply with the query only, inside a ```sql code block."
)
CHECKER_SYSTEM = (
    "You are the SQL checker. You check a SQLite query written for a question against the database schema and "
    "the query's execution result.\nDatabase schema:\n{schema}\n\n"
    "If the query answers the question exactly, reply with the single line: THE QUERY IS CORRECT.\n"
    "Otherwise explain briefly what is wrong (wrong table or column, missing condition, wrong aggregation, "
    "extra or missing columns, wrong order)."
)
REWRITER_SYSTEM = (
    "You are the SQL rewriter. You fix a SQLite query using the checker's feedback.\n"
    "Database schema:\n{schema}\n\n"
    "Reply with the corrected query only, inside a ```sql code block."
)
CORRECT_MARKER = "THE QUERY IS CORRECT"
RESULT_PREVIEW_ROWS = 10

_SQL_BLOCK = re.compile(r"```(?:sql|sqlite)?\s*\n?(.*?)```", re.IGNORECASE | re.DOTALL)


def extract_sql(text: str) -> str:
    """The SQL in a model reply: the last fenced code block, else the whole reply; trailing ``;`` removed."""
    blocks = _SQL_BLOCK.findall(text)
    sql = blocks[-1] if blocks else text
    return sql.strip().rstrip(";").strip()


def describe_execution(db_path: str, sql: str) -> str:
    """What the checker sees about a query's execution: an error, or the first rows."""
    if not sql:
        return "Error: the query is empty."
    try:
        rows = run_query(db_path, sql, timeout_s=5.0, max_rows=10_000)
    except QueryError as exc:
        return f"Error: {exc}"
    preview = "\n".join(repr(row) for row in rows[:RESULT_PREVIEW_ROWS])
    more = f"\n... ({len(rows) - RESULT_PREVIEW_ROWS} more rows)" if len(rows) > RESULT_PREVIEW_ROWS else ""
    return f"{len(rows)} rows.\n{preview}{more}" if rows else "0 rows (empty result)."


@dataclass
class AgentResult:
    """The final query and what happened on the way."""

    sql: str
    turns: int
    history: list[dict[str, str]] = field(default_factory=list)


class SQLAgent:
    """Writer -> (execute -> checker -> rewriter)* over one chat model."""

    def __init__(self, model: BaseChatModel, *, max_turns: int = 3) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns!r}")
        self.max_turns = max_turns
        parser = StrOutputParser()
        self.writer = (
            ChatPromptTemplate.from_messages([("system", WRITER_SYSTEM), ("human", "Question: {question}")])
            | model
            | parser
        ).with_config(run_name="writer")
        self.checker = (
            ChatPromptTemplate.from_messages(
                [
                    ("system", CHECKER_SYSTEM),
                    ("human", "Question: {question}\n\nQuery:\n```sql\n{sql}\n```\n\nExecution result:\n{execution}"),
                ]
            )
            | model
            | parser
        ).with_config(run_name="checker")
        self.rewriter = (
            ChatPromptTemplate.from_messages(
                [
                    ("system", REWRITER_SYSTEM),
                    (
                        "human",
                        "Question: {question}\n\nQuery:\n```sql\n{sql}\n```\n\nExecution result:\n{execution}\n\n"
                        "Checker feedback:\n{feedback}",
                    ),
                ]
            )
            | model
            | parser
        ).with_config(run_name="rewriter")

    def run(self, question: str, db_path: str) -> AgentResult:
        """Answer ``question`` with a SQL query for the database at ``db_path``."""
        schema = schema_text(db_path)
        sql = extract_sql(self.writer.invoke({"schema": schema, "question": question}))
        history = [{"step": "writer", "sql": sql}]
        for turn in range(1, self.max_turns + 1):
            execution = describe_execution(db_path, sql)
            feedback = self.checker.invoke({"schema": schema, "question": question, "sql": sql, "execution": execution})
            history.append({"step": "checker", "feedback": feedback})
            if CORRECT_MARKER.lower() in feedback.lower():
                return AgentResult(sql=sql, turns=turn, history=history)
            sql = extract_sql(
                self.rewriter.invoke(
                    {"schema": schema, "question": question, "sql": sql, "execution": execution, "feedback": feedback}
                )
            )
            history.append({"step": "rewriter", "sql": sql})
        return AgentResult(sql=sql, turns=self.max_turns, history=history)


def chat_model(llm: agl.LLM, **overrides: Any) -> ChatOpenAI:
    """A ChatOpenAI client for the rollout's endpoint."""
    settings: dict[str, Any] = {"temperature": 0.7, "max_tokens": 512}
    settings.update(llm.sampling_parameters)
    settings.update(overrides)
    return ChatOpenAI(model=llm.model, base_url=llm.base_url, api_key=llm.api_key, max_retries=1, **settings)


@agl.rollout(roles=["writer", "rewriter"])
def sql_agent(task: dict[str, Any], llm: agl.LLM, rollout: agl.Rollout) -> float:
    """One Spider episode: answer the question with SQL, reward 1 if it returns the gold result.

    The final query, its execution error (if any) and the number of check/rewrite turns are kept in
    ``rollout.output`` for inspection.
    """
    result = SQLAgent(chat_model(llm), max_turns=int(task.get("max_turns", 3))).run(task["question"], task["db_path"])
    match = execution_match(result.sql, task["gold_sql"], task["db_path"])
    rollout.output = {"sql": result.sql, "error": match.error, "turns": result.turns}
    if match.error is not None:
        logger.info("task %s: predicted SQL %r failed: %s", task.get("task_id"), result.sql, match.error)
    return match.reward
