"""What the server needs from a store (:class:`Store`); its errors are in :mod:`agentlightning.errors`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from agentlightning.protocol import AttemptInfo, DatasetInfo, Lease, ModelVersion, ResultOutcome, RolloutSummary, Task
from agentlightning.types import Call, Rollout


class Store(Protocol):
    """What the server needs from a store. Implementations must be safe to call from several threads."""

    def add_dataset(
        self, records: Sequence[Any], dataset_id: str | None = None, name: str | None = None
    ) -> DatasetInfo:
        """Store tasks; the id defaults to a hash of the content, so uploading the same data twice is a no-op."""

    def get_dataset(self, dataset_id: str) -> DatasetInfo | None:
        """The dataset, or None."""

    def list_datasets(self) -> list[DatasetInfo]:
        """All datasets, oldest first."""

    def dataset_tasks(self, dataset_id: str) -> list[Task]:
        """Tasks of a dataset in upload order (raises :class:`NotFound`)."""

    def enqueue(
        self,
        tasks: Sequence[Task],
        *,
        group_size: int = 1,
        group_id: str | None = None,
        dataset_id: str | None = None,
        timeout: float | None = None,
        max_attempts: int = 3,
    ) -> list[str]:
        """Queue ``group_size`` rollouts per task; returns their ids (grouped per task, in task order)."""

    def dequeue(self, worker_id: str, lease_seconds: float) -> Lease | None:
        """Lease the oldest queued rollout to ``worker_id`` on the current model version (None if none is queued). A
        rollout queued again after a failed attempt joins the back of the queue once its re-lease delay passed."""

    def heartbeat(self, rollout_id: str, attempt: int, worker_id: str, lease_seconds: float) -> str:
        """Extend ``worker_id``'s lease. Returns 'ok', or the reason the worker should abandon the attempt."""

    def complete(self, rollout_id: str, attempt: int, worker_id: str | None, result: Rollout) -> ResultOutcome:
        """Store the result of ``worker_id``'s attempt (idempotent; :class:`Conflict` for another worker's); joins the
        proxy's calls."""

    def complete_and_dequeue(
        self, rollout_id: str, attempt: int, worker_id: str, result: Rollout, lease_seconds: float
    ) -> tuple[ResultOutcome, Lease | None]:
        """:meth:`complete`, then :meth:`dequeue` for ``worker_id``, in one transaction. The lease is remembered with
        the result: re-sending that result (its answer was lost) returns the same lease while ``worker_id`` holds it,
        across restarts."""

    def expire_leases(self, now: float | None = None) -> list[ResultOutcome]:
        """Retry or fail running rollouts whose lease has expired."""

    def cancel(self, rollout_id: str) -> ResultOutcome:
        """Cancel a queued or running rollout."""

    def rollout_state(self, rollout_id: str) -> tuple[str, int] | None:
        """(state, attempt) of a rollout, or None if unknown. Cheap for running rollouts."""

    def attempt_state(self, rollout_id: str, attempt: int) -> tuple[str, str | None] | None:
        """(state of the rollout, status of its attempt ``attempt`` or None if it has none), or None for an unknown
        rollout. Cheap for a running attempt."""

    def record_proxy_call(self, call: dict[str, Any], attempt: int) -> None:
        """Remember a call the proxy forwarded for ``attempt`` of a rollout (JSON-ready :class:`Call` fields, validated
        when read back), committed before returning (kept for the next commit if that fails). One landing after its
        attempt finished the rollout joins its calls, ``metadata["late"]``."""

    def proxy_calls(self, rollout_id: str, attempt: int | None = None) -> list[Call]:
        """Calls the proxy recorded for a rollout (one attempt, or all), by start time."""

    def flush(self) -> None:
        """Write records whose earlier write failed (kept in memory meanwhile)."""

    def health(self) -> str | None:
        """None while the store can take writes, else why it cannot (cheap: no lock, no query)."""

    def get_rollout(self, rollout_id: str) -> Rollout | None:
        """The rollout with its calls and rewards, or None."""

    def list_rollouts(
        self,
        *,
        status: str | None = None,
        task_id: str | None = None,
        group_id: str | None = None,
        dataset_id: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[RolloutSummary]:
        """Rollouts without their calls, newest first."""

    def finished(self, rollout_ids: Iterable[str]) -> set[str]:
        """Which of ``rollout_ids`` are finished."""

    def attempts(self, rollout_id: str) -> list[AttemptInfo]:
        """Every attempt of a rollout, with errors and logs."""

    def counts(self) -> dict[str, int]:
        """Number of rollouts per state."""

    def set_model_version(self, version: str, model_name: str, upstream_url: str | None) -> ModelVersion:
        """Record the model now served: rollouts leased from now on are on this version."""

    def current_model(self) -> ModelVersion | None:
        """The latest model version, or None."""

    def workers(self) -> list[dict[str, Any]]:
        """Workers seen, with when they were last seen and how many rollouts they leased."""

    def close(self) -> None:
        """Flush and close."""
