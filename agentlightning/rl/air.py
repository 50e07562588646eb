"""Automatic Intermediate Rewarding (AIR): monitoring signals become rewards (``source='air'``) on the LLM calls that
caused them: :class:`ToolErrorRule` (a failed tool call penalises the LLM call that requested it),
:class:`LLMErrorRule`, :class:`FormatRule` (a regex or predicate on the text output) and :class:`CallRule` (any
``Call -> float | None``; plain functions in ``air=[...]`` are wrapped as one). A transition's reward is its credited
return plus the intermediate rewards attached to its call (:mod:`agentlightning.rl.transitions`)."""

from __future__ import annotations

import logging
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from agentlightning.types import Call, Reward, Rollout, check_finite, role_matches

logger = logging.getLogger(__name__)

CallRewardFunction = Callable[[Call], "float | None"]


class AirRule(ABC):
    """A rule turning what a rollout recorded into call-level rewards."""

    name: str

    @abstractmethod
    def rewards(self, rollout: Rollout) -> list[Reward]:
        """Rewards (``source='air'``) attached to LLM calls of ``rollout``."""

    def _reward(self, value: Any, call_id: str, rollout: Rollout) -> Reward:
        number = check_finite(value, f"AIR rule {self.name!r} on call {call_id!r} of rollout {rollout.rollout_id!r}")
        return Reward(value=number, call_id=call_id, source="air", name=self.name)


def responsible_llm_call(tool_call: Call, rollout: Rollout) -> str | None:
    """The LLM call that requested ``tool_call``: its ``parent_call_id``, else the latest LLM call before it."""
    if tool_call.parent_call_id is not None:
        return tool_call.parent_call_id
    earlier = [call for call in rollout.calls if call.kind == "llm" and call.sequence < tool_call.sequence]
    return max(earlier, key=lambda call: call.sequence).call_id if earlier else None


@dataclass
class ToolErrorRule(AirRule):
    """Penalise the LLM call whose requested tool call failed (status 'error')."""

    penalty: float = -1.0
    tools: Sequence[str] | None = None  # tool names (or globs) to watch; None watches every tool
    name: str = "tool_error"

    def rewards(self, rollout: Rollout) -> list[Reward]:
        found: list[Reward] = []
        for call in rollout.calls:
            if call.kind != "tool" or call.status != "error" or not role_matches(call.name, self.tools):
                continue
            parent = responsible_llm_call(call, rollout)
            if parent is None:
                logger.warning(
                    "AIR %s: failed tool call %s (%s) of rollout %s has no LLM call before it; no reward given",
                    self.name,
                    call.call_id,
                    call.name,
                    rollout.rollout_id,
                )
                continue
            found.append(self._reward(self.penalty, parent, rollout))
        return found


@dataclass
class LLMErrorRule(AirRule):
    """Penalise LLM calls that ended in an error (the penalty reaches training only if the call has tokens)."""

    penalty: float = -1.0
    name: str = "llm_error"

    def rewards(self, rollout: Rollout) -> list[Reward]:
        return [
            self._reward(self.penalty, call.call_id, rollout)
            for call in rollout.calls
            if call.kind == "llm" and call.status == "error"
        ]


def output_text(call: Call) -> str:
    """The text an LLM call produced (``output['content']``, or the output itself when it is a string)."""
    output = call.output
    if isinstance(output, str):
        return output
    if isinstance(output, dict) and isinstance(output.get("content"), str):
        return output["content"]
    return ""


@dataclass
class FormatRule(AirRule):
    """Check each successful LLM call's text output: ``passed`` when it conforms, ``failed`` when it does not.

    ``check`` is a regex (searched anywhere in the text; anchor it for a full match) or a predicate
    ``str -> bool``. ``roles`` limits the rule to some roles (names or globs); a value of None gives no reward.
    """

    check: str | re.Pattern[str] | Callable[[str], bool]
    failed: float | None = -1.0
    passed: float | None = None
    roles: Sequence[str] | None = None
    name: str = "format"
    _predicate: Callable[[str], bool] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.check, (str, re.Pattern)):
            try:
                pattern = re.compile(self.check)
            except re.error as exc:
                raise ValueError(f"FormatRule: invalid regex {self.check!r}: {exc}") from None
            self._predicate = lambda text: pattern.search(text) is not None
        elif callable(self.check):
            self._predicate = self.check
        else:
            raise ValueError(f"FormatRule: check must be a regex or a function str -> bool, got {self.check!r}")

    def rewards(self, rollout: Rollout) -> list[Reward]:
        found: list[Reward] = []
        for call in rollout.calls:
            if call.kind != "llm" or call.status != "ok" or not role_matches(call.role, self.roles):
                continue
            value = self.passed if self._predicate(output_text(call)) else self.failed
            if value is not None:
                found.append(self._reward(value, call.call_id, rollout))
        return found


@dataclass
class CallRule(AirRule):
    """Any function ``Call -> float | None`` applied to each call of ``kind``; None means no reward.

    Rewards computed on tool calls go to the LLM call that requested the tool.
    """

    function: CallRewardFunction
    kind: Literal["llm", "tool"] = "llm"
    name: str = ""

    def __post_init__(self) -> None:
        if not callable(self.function):
            raise ValueError(f"CallRule: function must be callable Call -> float | None, got {self.function!r}")
        if not self.name:
            self.name = getattr(self.function, "__name__", "call_rule")

    def rewards(self, rollout: Rollout) -> list[Reward]:
        found: list[Reward] = []
        for call in rollout.calls:
            value = self.function(call) if call.kind == self.kind else None
            if value is None:
                continue
            target = call.call_id if call.kind == "llm" else responsible_llm_call(call, rollout)
            if target is None:
                logger.warning(
                    "AIR %s: tool call %s of rollout %s has no LLM call before it; reward %r dropped",
                    self.name,
                    call.call_id,
                    rollout.rollout_id,
                    value,
                )
                continue
            found.append(self._reward(value, target, rollout))
        return found


class AIR:
    """A set of AIR rules applied together; ``AIR(rules).rewards(rollout)`` lists every reward they give."""

    def __init__(self, rules: Iterable[AirRule | CallRewardFunction]) -> None:
        self.rules: list[AirRule] = [as_rule(rule) for rule in rules]

    def rewards(self, rollout: Rollout) -> list[Reward]:
        """All AIR rewards of ``rollout``, rule by rule."""
        return [reward for rule in self.rules for reward in rule.rewards(rollout)]

    def __repr__(self) -> str:
        return f"AIR({self.rules!r})"


def as_rule(rule: AirRule | CallRewardFunction) -> AirRule:
    """``rule`` itself, or a plain function ``Call -> float | None`` wrapped as a :class:`CallRule`."""
    if isinstance(rule, AirRule):
        return rule
    if callable(rule):
        return CallRule(rule)
    raise ValueError(f"AIR rule must be an AirRule or a function Call -> float | None, got {rule!r}")


def as_air(air: AIR | Iterable[AirRule | CallRewardFunction] | AirRule | CallRewardFunction | None) -> AIR | None:
    """Normalise the ``air=`` argument of :func:`~agentlightning.rl.transitions.transitions`."""
    if air is None or isinstance(air, AIR):
        return air
    if isinstance(air, AirRule) or callable(air):
        return AIR([air])
    return AIR(air)
