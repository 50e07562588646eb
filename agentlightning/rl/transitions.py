"""From rollouts to training transitions: one transition per LLM call of a selected role, with the call's token ids,
logprobs, role, model version and group (the rollout's ``group_id``, else its ``task_id``), and the reward
``credit(rollout, calls)[i]`` plus the call-level rewards attached to call ``i`` (emitted, stored 'air', and those of
the ``air`` rules). Which rollouts count (succeeded with a final reward; failed and timed-out ones per ``failed=``) is
in docs/lightning_rl.md. Nothing is dropped silently: :func:`extract_transitions` counts every skip and
:func:`transitions` logs them as warnings.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

from agentlightning.rl.air import AIR, AirRule, CallRewardFunction, as_air
from agentlightning.rl.credit import CreditFunction, assign_credit, resolve_credit
from agentlightning.rl.tokens import (
    RetokenizeError,
    Tokenizer,
    retokenize_completion,
    retokenize_prompt,
)
from agentlightning.types import Call, Rollout, Transition, check_finite, role_matches, unmatched_patterns

logger = logging.getLogger(__name__)

FailedPolicy = Literal["if_rewarded", "include", "exclude"]
AirArgument = AIR | Iterable[AirRule | CallRewardFunction] | AirRule | CallRewardFunction | None

_FAILED_STATUSES = frozenset({"failed", "timeout"})
_FAILED_POLICIES = get_args(FailedPolicy)


@dataclass
class ExtractionStats:
    """What extraction used and what it skipped, and why."""

    rollouts_seen: int = 0
    rollouts_used: int = 0
    rollouts_skipped: Counter[str] = field(default_factory=Counter)  # reason -> rollouts
    calls_skipped: Counter[str] = field(default_factory=Counter)  # reason -> LLM calls of selected roles
    calls_not_selected: int = 0  # LLM calls whose role was not selected (context only)
    calls_retokenized: int = 0
    logprobs_dropped: int = 0  # calls whose logprobs did not match their completion length
    rewards_unassigned: int = 0  # call-level rewards on calls that produced no transition
    roles_seen: Counter[str | None] = field(default_factory=Counter)
    unmatched_roles: list[str] = field(default_factory=list)  # requested patterns matching no role seen
    transitions: int = 0

    def as_dict(self) -> dict[str, int]:
        """Flat counts for metrics logging (skips summed over reasons)."""
        return {
            name: sum(value.values()) if name.endswith("skipped") else value
            for name, value in vars(self).items()
            if name not in ("roles_seen", "unmatched_roles")
        }

    @classmethod
    def combined(cls, parts: Iterable[ExtractionStats]) -> ExtractionStats:
        """The statistics of several extractions as one (e.g. a training step's groups); a role pattern is
        unmatched if it matched in none of them."""
        total = cls()
        unmatched: list[str] | None = None
        for part in parts:
            for name, value in vars(part).items():
                if name == "unmatched_roles":
                    unmatched = list(value) if unmatched is None else [p for p in unmatched if p in value]
                else:
                    setattr(total, name, getattr(total, name) + value)
        total.unmatched_roles = unmatched or []
        return total

    def problems(self) -> list[str]:
        """Plain-words lines for every skip or fallback (empty when everything was used as recorded)."""
        lines: list[str] = []
        for reason, count in sorted(self.rollouts_skipped.items()):
            lines.append(f"{count} of {self.rollouts_seen} rollouts skipped: {reason}")
        for reason, count in sorted(self.calls_skipped.items()):
            lines.append(f"{count} LLM calls of selected roles skipped: {reason}")
        if self.calls_retokenized:
            lines.append(
                f"{self.calls_retokenized} calls had no recorded token ids and were re-tokenized from text "
                "(token_source='retokenized'; may drift from what the model sampled)"
            )
        if self.logprobs_dropped:
            lines.append(f"{self.logprobs_dropped} calls had logprobs not matching their completion; logprobs dropped")
        if self.rewards_unassigned:
            lines.append(
                f"{self.rewards_unassigned} call-level rewards were attached to calls that produced no "
                "transition (role not selected or call skipped) and were not used"
            )
        if self.unmatched_roles:
            seen = sorted(role for role in self.roles_seen if role is not None)
            unnamed = self.roles_seen.get(None, 0)
            lines.append(
                f"roles {self.unmatched_roles} matched no LLM call; roles seen: {seen or 'none'}"
                + (f" ({unnamed} calls had no role)" if unnamed else "")
            )
        if self.rollouts_seen and not self.transitions:
            lines.append(f"no transitions were produced from {self.rollouts_seen} rollouts")
        return lines


@dataclass
class Extraction:
    """Transitions and the statistics of how they were extracted."""

    transitions: list[Transition]
    stats: ExtractionStats


def extract_transitions(
    rollouts: Iterable[Rollout],
    roles: Sequence[str] | None = None,
    credit: str | CreditFunction = "identical",
    air: AirArgument = None,
    tokenizer: Tokenizer | None = None,
    *,
    failed: FailedPolicy = "if_rewarded",
    missing_reward: float | None = None,
    include_emitted: bool = True,
) -> Extraction:
    """Transitions of ``rollouts`` with full statistics; see the module docstring for the rules.

    ``roles``: role names or globs to train; None uses each rollout's ``trainable_roles`` (from
    ``@agl.rollout(roles=...)``), and all roles when that is None too. ``credit``: 'identical' (default),
    'last', ``discounted(gamma)`` or a function ``(rollout, calls) -> list[float]``. ``air``: AIR rules (or
    functions ``Call -> float | None``). ``tokenizer``: enables re-tokenization of calls without token ids.
    """
    patterns = _check_roles(roles)
    if failed not in _FAILED_POLICIES:
        raise ValueError(f"transitions(): failed={failed!r} is not a policy; use one of {list(_FAILED_POLICIES)}")
    if missing_reward is not None:
        missing_reward = check_finite(missing_reward, "extract_transitions(missing_reward=...)")
    credit_function = resolve_credit(credit)
    rules = as_air(air)
    if isinstance(rollouts, Rollout):
        raise TypeError("transitions() takes a list of rollouts; got a single Rollout (wrap it: [rollout])")
    stats = ExtractionStats()
    found: list[Transition] = []
    seen_ids: set[str] = set()
    requested = list(patterns or ())  # the role patterns asked for, to name those that matched nothing
    for rollout in rollouts:
        if not isinstance(rollout, Rollout):
            raise TypeError(f"transitions() expects Rollout records, got {type(rollout).__name__}: {rollout!r:.80}")
        if rollout.rollout_id in seen_ids:
            raise ValueError(
                f"rollout {rollout.rollout_id!r} was given twice; each rollout must appear once (it would weigh double)"
            )
        seen_ids.add(rollout.rollout_id)
        stats.rollouts_seen += 1
        usable = _usable_rollout(rollout, failed, missing_reward, stats)
        if usable is None:
            continue
        selected = patterns if patterns is not None else rollout.trainable_roles
        requested += [pattern for pattern in selected or () if pattern not in requested]
        made = _rollout_transitions(usable, selected, credit_function, rules, tokenizer, include_emitted, stats)
        if made:
            stats.rollouts_used += 1
            found.extend(made)
    if requested and stats.rollouts_seen:
        stats.unmatched_roles = unmatched_patterns(requested, stats.roles_seen)
    stats.transitions = len(found)
    return Extraction(found, stats)


def transitions(
    rollouts: Iterable[Rollout],
    roles: Sequence[str] | None = None,
    credit: str | CreditFunction = "identical",
    air: AirArgument = None,
    tokenizer: Tokenizer | None = None,
    *,
    failed: FailedPolicy = "if_rewarded",
    missing_reward: float | None = None,
    include_emitted: bool = True,
) -> list[Transition]:
    """Training transitions of ``rollouts`` after credit assignment and AIR (``agl.transitions``).

    Same arguments as :func:`extract_transitions`; every skip or fallback is logged as a warning.
    """
    extraction = extract_transitions(
        rollouts,
        roles,
        credit,
        air,
        tokenizer,
        failed=failed,
        missing_reward=missing_reward,
        include_emitted=include_emitted,
    )
    for line in extraction.stats.problems():
        logger.warning("agl.transitions: %s", line)
    return extraction.transitions


def _check_roles(roles: Sequence[str] | None) -> list[str] | None:
    if roles is None:
        return None
    if isinstance(roles, str):
        raise ValueError(
            f"transitions(roles=...): roles must be a list of role names or globs, got the string "
            f"{roles!r}; use [{roles!r}]"
        )
    patterns = list(roles)
    if not patterns or not all(isinstance(pattern, str) and pattern for pattern in patterns):
        raise ValueError(
            "transitions(roles=...): roles must be a non-empty list of role names or globs (or None for "
            f"all), got {roles!r}"
        )
    return patterns


def _usable_rollout(
    rollout: Rollout, failed: FailedPolicy, missing_reward: float | None, stats: ExtractionStats
) -> Rollout | None:
    """The rollout to extract from (with a substituted final reward when needed), or None with the reason counted."""
    status = rollout.status
    if status in _FAILED_STATUSES:
        if failed == "exclude":
            stats.rollouts_skipped[f"status {status!r} excluded (failed='exclude')"] += 1
            return None
        if rollout.final_reward is None and (failed == "if_rewarded" or missing_reward is None):
            stats.rollouts_skipped[f"status {status!r} without a final reward"] += 1
            return None
    elif status != "succeeded":
        stats.rollouts_skipped[f"status {status!r} (not a finished episode)"] += 1
        return None
    if rollout.final_reward is not None:
        check_finite(rollout.final_reward, f"final reward of rollout {rollout.rollout_id!r}")
        return rollout
    if missing_reward is None:
        stats.rollouts_skipped["no final reward (pass missing_reward=... to use a default)"] += 1
        return None
    return rollout.model_copy(update={"final_reward": missing_reward})


def _call_tokens(
    call: Call, tokenizer: Tokenizer | None, stats: ExtractionStats
) -> tuple[list[int], list[int], str | None] | None:
    """Prompt ids, completion ids and token source of a call, or None with the reason counted."""
    prompt, completion, source = call.prompt_token_ids, call.completion_token_ids, call.token_source
    if prompt is None or completion is None:
        if tokenizer is None:
            stats.calls_skipped["no token ids recorded and no tokenizer given for re-tokenization"] += 1
            return None
        try:
            prompt = prompt if prompt is not None else retokenize_prompt(call, tokenizer)
            completion = completion if completion is not None else retokenize_completion(call, tokenizer)
        except RetokenizeError as exc:
            stats.calls_skipped[f"no token ids recorded and re-tokenization impossible: {exc}"] += 1
            return None
        source = "retokenized"
        stats.calls_retokenized += 1
    if not completion:
        reason = "empty completion" + (" (the call ended in an error)" if call.status == "error" else "")
        stats.calls_skipped[reason] += 1
        return None
    return prompt, completion, source


def _rollout_transitions(
    rollout: Rollout,
    patterns: Sequence[str] | None,
    credit: CreditFunction,
    rules: AIR | None,
    tokenizer: Tokenizer | None,
    include_emitted: bool,
    stats: ExtractionStats,
) -> list[Transition]:
    calls: list[Call] = []
    tokens: list[tuple[list[int], list[int], str | None]] = []
    for call in rollout.llm_calls:
        stats.roles_seen[call.role] += 1
        if not role_matches(call.role, patterns):
            stats.calls_not_selected += 1
            continue
        found = _call_tokens(call, tokenizer, stats)
        if found is not None:
            calls.append(call)
            tokens.append(found)
    intermediate = _intermediate_rewards(rollout, rules, include_emitted)
    kept_ids = {call.call_id for call in calls}
    stats.rewards_unassigned += sum(count for call_id, (_, count) in intermediate.items() if call_id not in kept_ids)
    if not calls:
        stats.rollouts_skipped["no LLM call of a selected role with token ids"] += 1
        return []
    credited = assign_credit(credit, rollout, calls)
    made: list[Transition] = []
    for index, (call, (prompt, completion, source), value) in enumerate(zip(calls, tokens, credited, strict=True)):
        logprobs = call.completion_logprobs if source != "retokenized" else None
        if logprobs is not None and len(logprobs) != len(completion):
            stats.logprobs_dropped += 1
            logprobs = None
        reward = value + intermediate.get(call.call_id, (0.0, 0))[0]
        check_finite(reward, f"reward of call {call.call_id!r} in rollout {rollout.rollout_id!r}")
        # Fields come from validated records; model_construct skips re-validating long token lists.
        made.append(
            Transition.model_construct(
                rollout_id=rollout.rollout_id,
                task_id=rollout.task_id,
                index=index,
                call_id=call.call_id,
                role=call.role,
                group_id=rollout.group_id if rollout.group_id is not None else rollout.task_id,
                prompt_token_ids=prompt,
                completion_token_ids=completion,
                completion_logprobs=logprobs,
                token_source=source,
                reward=reward,
                advantage=None,
                weight=1.0,
                model_version=call.metadata.get("model_version") or rollout.model_version,
            )
        )
    return made


def _intermediate_rewards(rollout: Rollout, rules: AIR | None, include_emitted: bool) -> dict[str, tuple[float, int]]:
    """Sum and count of the call-level rewards of ``rollout`` per call id."""
    rewards = [reward for reward in rollout.rewards if reward.source != "final"] if include_emitted else []
    if rules is not None:
        rewards.extend(rules.rewards(rollout))
    totals: dict[str, tuple[float, int]] = {}
    for reward in rewards:
        if reward.call_id is not None:  # episode-level rewards other than the final one are not spread
            total, count = totals.get(reward.call_id, (0.0, 0))
            totals[reward.call_id] = (total + reward.value, count + 1)
    return totals
