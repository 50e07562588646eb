"""The records every part of Agent Lightning exchanges: pydantic models that round-trip through JSON and carry a
``schema_version`` so stored data can be migrated; and the two rules on them that every layer applies alike (which
roles a list of names or globs selects: :func:`role_matches`; how two records of one LLM response become one:
:func:`merge_records`)."""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Iterable, Sequence
from fnmatch import fnmatchcase
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

SCHEMA_VERSION = 1

CallKind = Literal["llm", "tool"]
CallStatus = Literal["ok", "error"]
TokenSource = Literal["server", "response", "retokenized"]
RewardSource = Literal["final", "emitted", "air"]
RolloutStatus = Literal["queued", "running", "succeeded", "failed", "timeout", "cancelled"]

FINISHED_STATUSES: frozenset[str] = frozenset({"succeeded", "failed", "timeout", "cancelled"})

# Preference when the same response was recorded twice (proxy and client): lower is better.
SOURCE_RANK: dict[str | None, int] = {"server": 0, "response": 1, "retokenized": 2, None: 3}

MISSED_BY_CAPTURE = "missed_by_capture"
"""Metadata key set on a proxy call that in-process capture did not record although it recorded other calls of the
same attempt through the proxy (an uninstrumented framework or a client that bypasses the patched path). Rollouts
that capture nothing in-process on purpose (``agl.CommandAgent``, agents calling over curl) are not marked."""


def new_id(prefix: str) -> str:
    """A short unique id such as ``ro-3f2a9c1b7d4e``."""
    return f"{prefix}-{secrets.token_hex(8)}"


def check_finite(value: Any, where: str) -> float:
    """Return ``value`` as a float, or raise ``ValueError`` naming the value and ``where`` it came from."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}: reward must be a finite number, got {type(value).__name__} {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{where}: reward must be a finite number, got {number!r}")
    return number


class Record(BaseModel):
    """Base of all records: JSON round-trip and a schema version (unknown fields are ignored)."""

    schema_version: int = Field(default=SCHEMA_VERSION, description="Version of the record layout.")


class LLM(Record):
    """Where the agent should send its LLM calls during a rollout (an OpenAI-compatible endpoint)."""

    base_url: str = Field(description="OpenAI-compatible base URL, e.g. 'http://127.0.0.1:4747/rollouts/ro-1/v1'.")
    model: str = Field(description="Model name to put in requests.")
    api_key: str = Field(default="EMPTY", description="API key; local servers accept any value.")
    sampling_parameters: dict[str, Any] = Field(
        default_factory=dict, description="Suggested sampling parameters (temperature, top_p, max_tokens, ...)."
    )
    model_version: str | None = Field(default=None, description="Version of the weights served at base_url.")


class Call(Record):
    """One LLM or tool invocation inside a rollout."""

    call_id: str = Field(default_factory=lambda: new_id("call"), description="Unique id of the call.")
    rollout_id: str | None = Field(default=None, description="Rollout the call belongs to.")
    sequence: int = Field(default=0, description="Order of the call within its rollout (0-based, by start time).")
    kind: CallKind = Field(default="llm", description="'llm' for a model invocation, 'tool' for a tool execution.")
    role: str | None = Field(default=None, description="Component speaking (agent name, chain step, agl.role).")
    name: str | None = Field(default=None, description="Model name for LLM calls, tool name for tool calls.")
    input: Any = Field(default=None, description="Chat messages / Responses input for LLM calls; arguments for tools.")
    output: Any = Field(
        default=None,
        description="LLM calls: {'content': str | None, 'tool_calls': [...], 'finish_reason': str}; tools: result.",
    )
    tools: list[dict[str, Any]] | None = Field(default=None, description="Tool schemas offered to the LLM.")
    prompt_token_ids: list[int] | None = Field(default=None, description="Exact prompt token ids, when known.")
    completion_token_ids: list[int] | None = Field(default=None, description="Exact completion token ids, when known.")
    completion_logprobs: list[float] | None = Field(
        default=None, description="Log-probability of each completion token under the sampling policy."
    )
    token_source: TokenSource | None = Field(
        default=None,
        description="Where the token ids came from: 'server' "
        "(recorded by our proxy), 'response' (fields returned by the backend to "
        "the client), 'retokenized' (rebuilt from text; a logged fallback), None "
        "(unknown).",
    )
    status: CallStatus = Field(default="ok", description="'error' if the call raised or the tool reported failure.")
    error: str | None = Field(default=None, description="Error type and message when status is 'error'.")
    parent_call_id: str | None = Field(default=None, description="For tool calls: the LLM call that requested it.")
    response_id: str | None = Field(default=None, description="Id the backend gave the response (joins proxy data).")
    start_time: float = Field(default_factory=time.time, description="Unix time when the call started.")
    end_time: float | None = Field(default=None, description="Unix time when the call finished.")
    metadata: dict[str, Any] = Field(
        default_factory=dict,
        description="Endpoint, api, sampling parameters, usage, model_version, stream flag and adapter details.",
    )

    @property
    def latency(self) -> float | None:
        """Seconds between start and end, when finished."""
        return None if self.end_time is None else self.end_time - self.start_time


class Reward(Record):
    """A reward: episode-level (``call_id`` None) or attached to one call."""

    value: float = Field(description="Finite reward value.")
    call_id: str | None = Field(default=None, description="Call the reward belongs to; None for the whole episode.")
    source: RewardSource = Field(default="emitted", description="'final', 'emitted' by the agent, or 'air' rules.")
    name: str | None = Field(default=None, description="Optional name (e.g. 'format', 'tool_error').")
    timestamp: float = Field(default_factory=time.time, description="Unix time when the reward was recorded.")

    @field_validator("value", mode="before")
    @classmethod
    def _finite(cls, value: Any) -> float:
        return check_finite(value, "Reward.value")


class ErrorInfo(Record):
    """What went wrong in a rollout."""

    type: str = Field(description="Exception class name, or 'Timeout'.")
    message: str = Field(description="Human-readable message.")
    traceback: str | None = Field(default=None, description="Formatted traceback, when there was one.")


class Rollout(Record):
    """One run of the agent on one task, with everything it produced."""

    rollout_id: str = Field(default_factory=lambda: new_id("ro"), description="Unique id of the rollout.")
    task_id: str | None = Field(default=None, description="Id of the task (stable across the group).")
    task: Any = Field(default=None, description="The task payload given to the agent (JSON-serialisable).")
    group_id: str | None = Field(default=None, description="GRPO group: rollouts of the same task in one step.")
    attempt: int = Field(default=1, description="Attempt number (1 for the first try, >1 after retries).")
    status: RolloutStatus = Field(default="queued", description="Lifecycle state.")
    calls: list[Call] = Field(default_factory=list, description="LLM and tool calls, ordered by sequence.")
    rewards: list[Reward] = Field(default_factory=list, description="All rewards recorded during the rollout.")
    final_reward: float | None = Field(default=None, description="Episode return R; None if none was given.")
    output: Any = Field(default=None, description="What the agent function returned (when not the reward).")
    error: ErrorInfo | None = Field(default=None, description="Why the rollout failed or timed out.")
    logs: list[str] = Field(default_factory=list, description="Log lines captured while the agent ran.")
    diagnostics: list[str] = Field(
        default_factory=list, description="Plain-words explanations, e.g. why no LLM call or reward was captured."
    )
    model_version: str | None = Field(default=None, description="Model version that served the rollout.")
    trainable_roles: list[str] | None = Field(
        default=None, description="Role names or glob patterns selected for training; None means all."
    )
    timings: dict[str, float] = Field(
        default_factory=dict, description="'start', 'end' (unix time) and 'duration' (seconds)."
    )

    @property
    def llm_calls(self) -> list[Call]:
        """The LLM calls of the rollout, in order."""
        return [call for call in self.calls if call.kind == "llm"]

    @property
    def finished(self) -> bool:
        """Whether the rollout reached a terminal state."""
        return self.status in FINISHED_STATUSES


class Transition(Record):
    """One training sample: a single LLM call of a selected role, with its credited reward."""

    rollout_id: str = Field(description="Rollout the transition comes from.")
    task_id: str | None = Field(default=None, description="Task of the rollout.")
    group_id: str | None = Field(default=None, description="Group used for group-relative advantages.")
    index: int = Field(description="Position of the transition within its rollout's selected calls.")
    call_id: str | None = Field(default=None, description="Call the transition was made from.")
    role: str | None = Field(default=None, description="Role of the call.")
    prompt_token_ids: list[int] = Field(default_factory=list, description="Prompt (observation) token ids.")
    completion_token_ids: list[int] = Field(default_factory=list, description="Completion (action) token ids.")
    completion_logprobs: list[float] | None = Field(default=None, description="Sampling log-probabilities.")
    token_source: TokenSource | None = Field(default=None, description="Where the token ids came from.")
    reward: float = Field(default=0.0, description="Reward after credit assignment (and AIR).")
    advantage: float | None = Field(default=None, description="Advantage, once an estimator has run.")
    weight: float = Field(default=1.0, description="Loss weight (per-rollout normalisation).")
    model_version: str | None = Field(default=None, description="Model version that produced the completion.")


def role_matches(role: str | None, patterns: Sequence[str] | None) -> bool:
    """Whether ``role`` is selected by ``patterns``, role names or globs (None selects every role, including unnamed
    calls)."""
    if patterns is None:
        return True
    if role is None:
        return False
    return any(role == pattern or fnmatchcase(role, pattern) for pattern in patterns)


def unmatched_patterns(patterns: Sequence[str], roles_seen: Iterable[str | None]) -> list[str]:
    """The patterns that select none of ``roles_seen``."""
    seen = [role for role in roles_seen if role is not None]
    return [pattern for pattern in patterns if not any(role_matches(role, [pattern]) for role in seen)]


def _rank(call: Call) -> tuple[bool, int]:
    """Sort key of a record's token ids: both prompt and completion ids first, then by source (lower is better)."""
    return call.prompt_token_ids is None or call.completion_token_ids is None, SOURCE_RANK.get(call.token_source, 3)


def merge_records(call: Call, other: Call) -> None:
    """Complete ``call`` with ``other``, another record of the same LLM response (the client's capture and the
    proxy's, say): ``call`` takes the token ids, logprobs and model version of ``other`` when their source ranks
    better (:data:`SOURCE_RANK`), and its role and response id when it has none."""
    if _rank(other) < _rank(call):
        call.prompt_token_ids = other.prompt_token_ids
        call.completion_token_ids = other.completion_token_ids
        call.completion_logprobs = other.completion_logprobs
        call.token_source = other.token_source
        for key in ("model_version", "policy"):  # the version (and policy) that produced these ids
            if key in other.metadata:
                call.metadata[key] = other.metadata[key]
    if call.role is None:
        call.role = other.role
    if call.response_id is None:
        call.response_id = other.response_id
