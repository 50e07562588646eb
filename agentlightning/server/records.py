"""Records the store returns and the server's HTTP API exchanges (besides the core ``Rollout``/``Call``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from agentlightning.types import LLM, ErrorInfo


class DatasetInfo(BaseModel):
    """An uploaded dataset."""

    dataset_id: str
    name: str | None = None
    size: int = Field(description="Number of tasks.")
    created: float


class Task(BaseModel):
    """One task of a dataset (its payload is given to the agent unchanged)."""

    task_id: str
    payload: Any


class Lease(BaseModel):
    """A rollout handed to a worker: run ``task`` with ``llm`` and report before the lease expires."""

    rollout_id: str
    task_id: str | None
    task: Any
    group_id: str | None
    attempt: int
    timeout: float | None = Field(description="Seconds the agent may run before it is killed.")
    lease_seconds: float = Field(description="Heart-beat at least this often (a third of it is advised).")
    llm: LLM | None = Field(default=None, description="The rollout's model endpoint (filled in by the server).")


class ResultOutcome(BaseModel):
    """What the store did with an uploaded result."""

    rollout_id: str
    accepted: bool = Field(description="The result was stored (False for duplicates and stale attempts).")
    duplicate: bool = False
    status: str = Field(description="Rollout state after the result.")
    attempt: int = Field(description="Current attempt of the rollout after the result.")
    retried: bool = Field(default=False, description="The attempt failed and the rollout was queued again.")
    message: str = ""


class RolloutSummary(BaseModel):
    """A row of ``agl rollouts list``: a rollout without its calls."""

    rollout_id: str
    task_id: str | None
    dataset_id: str | None
    group_id: str | None
    status: str
    attempt: int
    max_attempts: int
    final_reward: float | None
    model_version: str | None
    worker_id: str | None
    n_calls: int | None
    created: float
    started: float | None
    ended: float | None


class AttemptInfo(BaseModel):
    """One attempt of a rollout, with its error and logs kept even when the rollout was retried."""

    rollout_id: str
    attempt: int
    worker_id: str | None
    status: str
    started: float | None
    ended: float | None
    error: ErrorInfo | None = None
    logs: list[str] = Field(default_factory=list)


class ModelVersion(BaseModel):
    """A model version the proxy forwarded to."""

    version: str
    model_name: str
    upstream_url: str | None
    created: float
