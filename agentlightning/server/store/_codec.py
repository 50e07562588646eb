"""Records as the store keeps them: JSON text of task payloads (finite numbers only), task ids checked for
collisions, stored call records read back."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import ValidationError

from agentlightning.server.store._interface import StoreError
from agentlightning.types import Call

logger = logging.getLogger(__name__)


def json_text_of(value: Any, what: str) -> str:
    """``value`` as JSON text (finite numbers only), or a :class:`StoreError` naming ``what``."""
    try:
        return json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"{what} is not JSON data (finite numbers, strings, lists, objects): {exc}") from None


def check_task_ids(tasks: Sequence[tuple[str, str]]) -> None:
    """Refuse two tasks (task id, payload) with the same id and different content: they would share GRPO groups."""
    first: dict[str, tuple[int, str]] = {}
    for index, (task_id, payload) in enumerate(tasks):
        seen = first.setdefault(task_id, (index, payload))
        if seen[1] != payload:
            raise StoreError(f"records {seen[0]} and {index} (0-based) have the same task id {task_id!r} but different "
                             "content: GRPO groups are formed per task id, so give each task its own id")


def calls_from_json(bodies: Iterable[str], rollout_id: str) -> list[Call]:
    """Stored proxy records as calls; a record that is not a valid call is skipped with a warning (one bad upstream
    answer must not make its rollout's result unstorable)."""
    calls: list[Call] = []
    for body in bodies:
        try:
            calls.append(Call.model_validate_json(body))
        except ValidationError as exc:
            logger.warning("rollout %s: skipping an invalid proxy call record: %s", rollout_id, exc)
    return calls
