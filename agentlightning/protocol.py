"""The records, ids and errors of the Lightning Server's HTTP API, shared by the server and its clients."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, Field

# The protocol's errors are defined with all others in agentlightning.errors; clients import them from here too.
from agentlightning.errors import ProtocolError as ProtocolError
from agentlightning.errors import ServerError as ServerError
from agentlightning.errors import Unreachable as Unreachable
from agentlightning.types import LLM, ErrorInfo

ROLE_HEADER = "X-AGL-Role"
"""Request header naming the role of an LLM call (set by capture), by which the proxy picks the role's policy."""


def proxy_path(rollout_id: str, attempt: int) -> str:
    """The path of an attempt's LLM endpoint on the server (its ``llm.base_url`` without the origin): the proxy
    records each call under the attempt it names, so calls stay with the attempt that made them after a re-lease."""
    return f"/rollouts/{rollout_id}/attempts/{attempt}/v1"


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


def dataset_id_for(records: Sequence[Any]) -> str:
    """Content-derived dataset id: the same records always get the same id."""
    digest = hashlib.sha256()
    for record in records:
        digest.update(json.dumps(record, sort_keys=True, separators=(",", ":")).encode())
        digest.update(b"\n")
    return f"ds-{digest.hexdigest()[:16]}"


def task_id_for(task: Any, dataset_id: str | None = None, index: int | None = None) -> str:
    """A task's id: its own ``task_id`` / ``id`` field; else ``<dataset_id>:<index>`` for a row of an uploaded
    dataset; else a content hash (equal tasks share an id, as GRPO groups need)."""
    if isinstance(task, Mapping):
        for key in ("task_id", "id"):
            if task.get(key) is not None:
                return str(task[key])
    if dataset_id is not None:
        return f"{dataset_id}:{index}"
    digest = hashlib.sha1(json.dumps(task, sort_keys=True, default=repr).encode()).hexdigest()
    return f"task-{digest[:12]}"
