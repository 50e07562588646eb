"""Credit assignment: a function ``(rollout, calls) -> one float per call`` spreads the episode return R over the LLM
calls that become transitions: ``identical`` (the paper's default: every call gets R), ``last`` (the final call gets R,
earlier ones 0), ``discounted(gamma)`` (call ``t`` of ``T`` gets ``gamma ** (T - 1 - t) * R``), or any callable.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from agentlightning.types import Call, Rollout

CreditFunction = Callable[[Rollout, Sequence[Call]], Sequence[float]]


def episode_return(rollout: Rollout) -> float:
    """The rollout's final reward R, or ``ValueError`` naming the rollout when it has none."""
    if rollout.final_reward is None:
        raise ValueError(
            f"rollout {rollout.rollout_id!r} (task {rollout.task_id!r}, status {rollout.status!r}) has no "
            "final reward to assign credit from"
        )
    return rollout.final_reward


def identical(rollout: Rollout, calls: Sequence[Call]) -> list[float]:
    """Every call gets the episode return R."""
    return [episode_return(rollout)] * len(calls)


def last(rollout: Rollout, calls: Sequence[Call]) -> list[float]:
    """Only the final call gets R; the calls before it get 0."""
    value = episode_return(rollout)
    return [0.0] * (len(calls) - 1) + [value] if calls else []


def discounted(gamma: float) -> CreditFunction:
    """Credit ``gamma ** (steps to the end) * R``: the final call gets R, the one before ``gamma * R``, ..."""
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not 0.0 <= gamma <= 1.0:
        raise ValueError(f"discounted(gamma): gamma must be a number in [0, 1], got {gamma!r}")

    def credit(rollout: Rollout, calls: Sequence[Call]) -> list[float]:
        value = episode_return(rollout)
        return [value * gamma ** (len(calls) - 1 - index) for index in range(len(calls))]

    credit.__name__ = credit.__qualname__ = f"discounted({gamma})"
    return credit


CREDIT_FUNCTIONS: dict[str, CreditFunction] = {"identical": identical, "last": last}


def resolve_credit(credit: str | CreditFunction) -> CreditFunction:
    """The credit function named by ``credit`` (``'identical'``, ``'last'``), or ``credit`` itself if callable."""
    if isinstance(credit, str):
        try:
            return CREDIT_FUNCTIONS[credit]
        except KeyError:
            raise ValueError(
                f"unknown credit assignment {credit!r}; use one of {sorted(CREDIT_FUNCTIONS)}, "
                "agentlightning.rl.credit.discounted(gamma), or a function (rollout, calls) -> list[float]"
            ) from None
    if not callable(credit):
        raise ValueError(f"credit must be a name or a function (rollout, calls) -> list[float], got {credit!r}")
    return credit


def assign_credit(credit: CreditFunction, rollout: Rollout, calls: Sequence[Call]) -> list[float]:
    """Run ``credit`` and check its answer: one finite number per call, else ``ValueError`` naming the place."""
    name = getattr(credit, "__qualname__", repr(credit))
    values = list(credit(rollout, calls))
    if len(values) != len(calls):
        raise ValueError(
            f"credit function {name!r} returned {len(values)} values for the {len(calls)} calls of "
            f"rollout {rollout.rollout_id!r}"
        )
    for call, value in zip(calls, values, strict=True):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(
                f"credit function {name!r} gave call {call.call_id!r} of rollout {rollout.rollout_id!r} "
                f"a non-finite value {value!r}"
            )
    return [float(value) for value in values]
