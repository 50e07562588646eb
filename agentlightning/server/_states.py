"""The rollout state machine, as plain data and pure functions: ``queued`` until leased (``running``); retryable
outcomes send a rollout back to ``queued`` with the next attempt while attempts remain, others are final."""

from __future__ import annotations

from dataclasses import dataclass

from agentlightning.errors import InvalidTransition

# (state, event) -> state the event leads to, before retries are considered.
NEXT_STATE: dict[tuple[str, str], str] = {
    ("queued", "dequeue"): "running",
    ("queued", "cancel"): "cancelled",
    ("running", "succeed"): "succeeded",
    ("running", "fail"): "failed",
    ("running", "timeout"): "timeout",
    ("running", "lease_expired"): "failed",
    ("running", "cancel"): "cancelled",
    # A late success from an attempt whose lease expired still finishes the rollout: finished work is never lost.
    ("queued", "succeed"): "succeeded",
}

# Outcomes that are retried while attempts remain.
RETRYABLE_EVENTS: frozenset[str] = frozenset({"fail", "timeout", "lease_expired"})

# What a worker-reported final rollout status (types.FINISHED_STATUSES) means as an event.
STATUS_EVENTS: dict[str, str] = {"succeeded": "succeed", "failed": "fail", "timeout": "timeout", "cancelled": "cancel"}


@dataclass(frozen=True)
class Decision:
    """Result of applying an event: the new state, the attempt it is in, and whether this was a retry."""

    state: str
    attempt: int
    retried: bool


def decide(state: str, event: str, attempt: int, max_attempts: int) -> Decision:
    """Apply ``event`` to a rollout in ``state`` on attempt ``attempt`` (1-based) allowing ``max_attempts``."""
    target = NEXT_STATE.get((state, event))
    if target is None:
        raise InvalidTransition(f"rollout in state {state!r} cannot take event {event!r}")
    if event in RETRYABLE_EVENTS and attempt < max_attempts:
        return Decision("queued", attempt + 1, True)
    return Decision(target, attempt, False)


def event_for_status(status: str) -> str:
    """The event a worker's reported final rollout ``status`` stands for."""
    if status not in STATUS_EVENTS:
        allowed = ", ".join(sorted(STATUS_EVENTS))
        raise InvalidTransition(f"a result must have a final status ({allowed}), got {status!r}")
    return STATUS_EVENTS[status]
