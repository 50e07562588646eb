"""What the server needs from a store (:class:`Store`), and the store's errors."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any

from agentlightning.protocol import AttemptInfo, DatasetInfo, Lease, ModelVersion, ResultOutcome, RolloutSummary, Task
from agentlightning.types import Call, Rollout


class StoreError(Exception):
    """Base of the store's errors (each maps to a 4xx answer of the server)."""


class NotFound(StoreError):
    """An id that the store does not know."""


class Conflict(StoreError):
    """A request that contradicts the stored state (e.g. a result for a rollout finished by another attempt)."""


class Store(ABC):
    """What the server needs from a store. Implementations must be safe to call from several threads."""

    @abstractmethod
    def add_dataset(self, records: Sequence[Any], dataset_id: str | None = None, name: str | None = None) -> DatasetInfo:
        """Store tasks; the id defaults to a hash of the content, so uploading the same data twice is a no-op."""

    @abstractmethod
    def get_dataset(self, dataset_id: str) -> DatasetInfo | None:
        """The dataset, or None."""

    @abstractmethod
    def list_datasets(self) -> list[DatasetInfo]:
        """All datasets, oldest first."""

    @abstractmethod
    def dataset_tasks(self, dataset_id: str) -> list[Task]:
        """Tasks of a dataset in upload order (raises :class:`NotFound`)."""

    @abstractmethod
    def enqueue(
        self, tasks: Sequence[Task], *, group_size: int = 1, group_id: str | None = None,
        dataset_id: str | None = None, timeout: float | None = None, max_attempts: int = 3,
    ) -> list[str]:
        """Queue ``group_size`` rollouts per task; returns their ids (grouped per task, in task order)."""

    @abstractmethod
    def dequeue(self, worker_id: str, lease_seconds: float) -> Lease | None:
        """Lease the oldest queued rollout to ``worker_id``, or None when the queue is empty. The rollout's model
        version is the one current now (:meth:`set_model_version`)."""

    @abstractmethod
    def heartbeat(self, rollout_id: str, attempt: int, worker_id: str, lease_seconds: float) -> str:
        """Extend a lease. Returns 'ok', or the reason the worker should abandon the attempt."""

    @abstractmethod
    def complete(self, rollout_id: str, attempt: int, worker_id: str | None, result: Rollout) -> ResultOutcome:
        """Store a worker's result (idempotent per rollout and attempt); joins the proxy's calls."""

    def complete_and_dequeue(
        self, rollout_id: str, attempt: int, worker_id: str, result: Rollout, lease_seconds: float
    ) -> tuple[ResultOutcome, Lease | None]:
        """:meth:`complete`, then :meth:`dequeue` for ``worker_id`` (a store may do both in one transaction)."""
        return self.complete(rollout_id, attempt, worker_id, result), self.dequeue(worker_id, lease_seconds)

    @abstractmethod
    def expire_leases(self, now: float | None = None) -> list[ResultOutcome]:
        """Retry or fail running rollouts whose lease has expired."""

    @abstractmethod
    def cancel(self, rollout_id: str) -> ResultOutcome:
        """Cancel a queued or running rollout."""

    @abstractmethod
    def rollout_state(self, rollout_id: str) -> tuple[str, int] | None:
        """(state, attempt) of a rollout, or None if unknown. Cheap for running rollouts."""

    @abstractmethod
    def record_proxy_call(self, call: dict[str, Any], attempt: int) -> None:
        """Remember a call the proxy forwarded for ``attempt`` of a rollout (buffered while that attempt runs; see
        :meth:`flush`). ``call`` holds :class:`Call` fields, JSON-ready, with ``call_id``, ``rollout_id`` and
        ``start_time``; it is validated when read back. A call that lands after its attempt's result finished the
        rollout (e.g. in flight at the timeout) is joined into the stored rollout's calls, marked
        ``metadata["late"]``."""

    @abstractmethod
    def proxy_calls(self, rollout_id: str, attempt: int | None = None) -> list[Call]:
        """Calls the proxy recorded for a rollout (one attempt, or all), by start time."""

    @abstractmethod
    def flush(self) -> None:
        """Write buffered records."""

    @abstractmethod
    def get_rollout(self, rollout_id: str) -> Rollout | None:
        """The rollout with its calls and rewards, or None."""

    @abstractmethod
    def list_rollouts(
        self, *, status: str | None = None, task_id: str | None = None, group_id: str | None = None,
        dataset_id: str | None = None, limit: int = 100, offset: int = 0,
    ) -> list[RolloutSummary]:
        """Rollouts without their calls, newest first."""

    @abstractmethod
    def finished(self, rollout_ids: Iterable[str]) -> set[str]:
        """Which of ``rollout_ids`` are finished."""

    @abstractmethod
    def attempts(self, rollout_id: str) -> list[AttemptInfo]:
        """Every attempt of a rollout, with errors and logs."""

    @abstractmethod
    def counts(self) -> dict[str, int]:
        """Number of rollouts per state."""

    @abstractmethod
    def set_model_version(self, version: str, model_name: str, upstream_url: str | None) -> ModelVersion:
        """Record the model now served: rollouts leased from now on are on this version."""

    @abstractmethod
    def current_model(self) -> ModelVersion | None:
        """The latest model version, or None."""

    @abstractmethod
    def workers(self) -> list[dict[str, Any]]:
        """Workers seen, with when they were last seen and how many rollouts they leased."""

    @abstractmethod
    def close(self) -> None:
        """Flush and close."""
