"""Advantage estimators over transitions, normalised at the rollout level, and per-rollout loss weights.

Every statistic weighs rollouts equally, however many transitions they have (a rollout's transitions share a weight
of 1), so with identical credit the group mean and std are those of the rollouts' returns, as TRL's GRPO computes
them (``ddof=1``). The estimators and weightings, with their formulas, are in docs/lightning_rl.md ("Advantages and
loss weights")."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from agentlightning.types import Transition

logger = logging.getLogger(__name__)

Estimator = Literal["grpo", "dr_grpo", "reinforce++", "reinforce++_baseline"]
Weighting = Literal["rollout", "rollout_token", "token", "transition"]

ESTIMATORS: tuple[str, ...] = ("grpo", "dr_grpo", "reinforce++", "reinforce++_baseline")
GROUP_BASELINES: tuple[str, ...] = ("grpo", "dr_grpo", "reinforce++_baseline")  # centred per group: a tie is no signal
WEIGHTINGS: tuple[str, ...] = ("rollout", "rollout_token", "token", "transition")
_Centre = Callable[[Transition], float]
_DEFAULT_SCALE = {"grpo": True, "dr_grpo": False, "reinforce++": True, "reinforce++_baseline": True}


@dataclass
class _RolloutRows:
    """The transitions of one rollout."""

    rollout_id: str
    group: str
    rows: list[Transition] = field(default_factory=list)


def compute_advantages(
    transitions: Sequence[Transition],
    estimator: Estimator = "grpo",
    scale_std: bool | None = None,
    *,
    eps: float = 1e-6,
    std_ddof: int = 1,
    weighting: Weighting = "rollout",
) -> list[Transition]:
    """Fill ``advantage`` and ``weight`` of ``transitions`` in place and return them.

    ``scale_std`` defaults to the estimator's definition (False for ``dr_grpo``, True otherwise);
    ``dr_grpo`` with ``scale_std=True`` is rejected (that is ``grpo``). A non-finite reward raises
    ``ValueError`` naming the rollout and call.
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {estimator!r}; use one of {list(ESTIMATORS)}")
    if weighting not in WEIGHTINGS:
        raise ValueError(f"unknown weighting {weighting!r}; use one of {list(WEIGHTINGS)}")
    if estimator == "dr_grpo" and scale_std:
        raise ValueError("estimator='dr_grpo' is GRPO without std scaling; use estimator='grpo' to scale by std")
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    if isinstance(std_ddof, bool) or not isinstance(std_ddof, int) or std_ddof < 0:
        raise ValueError(f"std_ddof must be an integer >= 0, got {std_ddof!r}")
    scale = _DEFAULT_SCALE[estimator] if scale_std is None else bool(scale_std)
    rollouts = _by_rollout(transitions)
    if not rollouts:
        return list(transitions)

    # Centred on the batch mean (reinforce++) or the group's (the others); scaled by the spread over the group (GRPO)
    # or over the batch (reinforce++ and its baseline variant).
    def key(group: str) -> str | None:
        return None if estimator == "reinforce++" else group

    groups: dict[str | None, list[_RolloutRows]] = {}
    for rollout in rollouts.values():
        groups.setdefault(key(rollout.group), []).append(rollout)
    centres = {group: _mean(members) for group, members in groups.items()}
    per_group = estimator in ("grpo", "dr_grpo")
    singletons = sum(1 for members in groups.values() if len(members) == 1)
    if per_group and singletons:
        logger.warning(
            "%s: %d of %d groups have a single rollout; their advantages are only centred (0 with identical "
            "credit). Run several rollouts per task (group_size > 1) for a learning signal.",
            estimator,
            singletons,
            len(groups),
        )
    for members in groups.values() if per_group else [list(rollouts.values())]:
        spread = _std(members, lambda row: centres[key(group_key(row))], std_ddof) if scale else None
        for rollout in members:
            _set(rollout, lambda row: centres[key(group_key(row))], spread, eps)

    for rollout in rollouts.values():
        _set_weights(rollout, weighting)
    return list(transitions)


def group_key(row: Transition) -> str:
    """The group ``row`` is normalised in: its ``group_id``, else a group of its own rollout."""
    return row.group_id if row.group_id is not None else f"rollout:{row.rollout_id}"


def _by_rollout(transitions: Sequence[Transition]) -> dict[str, _RolloutRows]:
    """Transitions grouped by rollout (in order), with rewards checked and group ids consistent."""
    rollouts: dict[str, _RolloutRows] = {}
    ungrouped = 0
    for row in transitions:
        if not isinstance(row, Transition):
            raise TypeError(f"compute_advantages expects Transition records, got {type(row).__name__}")
        reward = row.reward
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise ValueError(
                f"transition {row.index} (call {row.call_id!r}) of rollout {row.rollout_id!r} has a non-finite "
                f"reward {reward!r}"
            )
        group = group_key(row)
        entry = rollouts.get(row.rollout_id)
        if entry is None:
            entry = rollouts[row.rollout_id] = _RolloutRows(row.rollout_id, group)
            ungrouped += row.group_id is None
        elif entry.group != group:
            raise ValueError(
                f"rollout {row.rollout_id!r} has transitions in two groups ({entry.group!r} and {group!r})"
            )
        entry.rows.append(row)
    if ungrouped:
        logger.warning(
            "%d rollouts have no group_id or task_id; each forms a group of its own for advantage estimation", ungrouped
        )
    return rollouts


def _mean(members: Sequence[_RolloutRows]) -> float:
    """Mean reward with every rollout weighing 1 (its transitions 1/n each)."""
    return _exact_mean([_exact_mean([row.reward for row in rollout.rows]) for rollout in members])


def _exact_mean(values: Sequence[float]) -> float:
    """The mean, computed around the first value: equal values give exactly that value (``fsum([x] * 3) / 3`` may
    not), so a group whose rewards all tie gets advantages of exactly 0 rather than rounding noise over ``eps``."""
    return values[0] + math.fsum(value - values[0] for value in values) / len(values)


def _std(members: Sequence[_RolloutRows], centre_of: _Centre, ddof: int) -> float | None:
    """Rollout-weighted standard deviation around ``centre_of(row)``; None when there are too few rollouts."""
    dof = len(members) - ddof
    if dof <= 0:
        return None
    total = math.fsum(
        math.fsum((row.reward - centre_of(row)) ** 2 for row in rollout.rows) / len(rollout.rows) for rollout in members
    )
    return math.sqrt(total / dof)


def _set(rollout: _RolloutRows, centre_of: _Centre, spread: float | None, eps: float) -> None:
    for row in rollout.rows:
        advantage = row.reward - centre_of(row)
        if spread is not None and spread + eps > 0:  # spread 0 means every reward equals the centre
            advantage /= spread + eps
        if not math.isfinite(advantage):
            raise ValueError(
                f"advantage of transition {row.index} (call {row.call_id!r}) of rollout {row.rollout_id!r} is "
                f"{advantage!r} (reward {row.reward!r}, std {spread!r}, eps {eps!r})"
            )
        row.advantage = advantage


def _set_weights(rollout: _RolloutRows, weighting: str) -> None:
    rows = rollout.rows
    tokens = sum(len(row.completion_token_ids) for row in rows)
    for row in rows:
        length = len(row.completion_token_ids)
        row.weight = {
            "rollout": 1.0 / len(rows),
            "transition": 1.0,
            "token": float(length),
            "rollout_token": length / tokens if tokens else 1.0 / len(rows),
        }[weighting]
