"""``EvalReport``: what one evaluation of an agent measured, built from its rollouts, saved as JSON, compared.

Scores: the mean reward (a rollout that failed or gave no reward counts 0) and the accuracy (the share of rollouts
judged right: ``final_reward >= success_threshold`` unless a judge is given), each with a 95% interval; then what
the agent did: LLM calls per role, tool calls and the share that failed, tokens, and the rollouts that failed.
"""

from __future__ import annotations

import collections
import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from agentlightning.evaluation._intervals import (
    Interval,
    bootstrap_mean_interval,
    newcombe_difference,
    paired_difference,
    unpaired_mean_difference,
    wilson_interval,
)
from agentlightning.types import Record, Rollout

MAX_FAILURES_LISTED = 20


class TaskResult(BaseModel):
    """One task's result, averaged over its rollouts when it was run several times."""

    task_id: str | None
    reward: float = Field(description="Mean reward of the task's rollouts.")
    accuracy: float = Field(description="Share of the task's rollouts that were right.")
    rollouts: int = 1


class Failure(BaseModel):
    """A rollout that did not succeed, and why."""

    task_id: str | None
    status: str
    error: str | None


class EvalReport(Record):
    """The scores of one evaluation run and what the agent did (see the module docstring)."""

    name: str = Field(description="What was evaluated, e.g. 'svamp-heldout'.")
    agent: str | None = Field(default=None, description="Name of the agent function.")
    model: str = Field(description="The model as given: a run directory, a model name or directory, or a URL.")
    model_version: str | None = Field(default=None, description="Version of the weights that served the calls.")
    temperature: float | None = Field(default=None, description="Sampling temperature asked for (0: greedy).")
    created: float = Field(default_factory=time.time, description="Unix time the report was made.")
    seconds: float = Field(default=0.0, description="Wall time of the rollouts.")
    rollouts: int = Field(description="Rollouts run (tasks x repeats).")
    tasks: int = Field(description="Distinct tasks.")
    success_threshold: float = Field(default=1.0, description="Reward at or above which a rollout is right.")
    reward: Interval = Field(description="Mean reward with a bootstrap 95% interval.")
    accuracy: Interval = Field(description="Share of right rollouts with a Wilson 95% interval.")
    status: dict[str, int] = Field(default_factory=dict, description="Rollouts per final status.")
    llm_calls: int = 0
    calls_by_role: dict[str, int] = Field(default_factory=dict, description="LLM calls per role.")
    tool_calls: int = 0
    tool_errors: int = 0
    tool_error_rate: float | None = Field(default=None, description="Failed tool calls / tool calls (None: none).")
    tool_calls_by_name: dict[str, int] = Field(default_factory=dict)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    failures: list[Failure] = Field(default_factory=list, description=f"Up to {MAX_FAILURES_LISTED} failures.")
    per_task: list[TaskResult] = Field(default_factory=list, description="Per-task results (for paired comparison).")
    rollout_records: list[Rollout] = Field(default_factory=list, exclude=True, description="The rollouts (not saved).")

    @classmethod
    def from_rollouts(
        cls,
        rollouts: Sequence[Rollout],
        *,
        name: str,
        model: str,
        success_threshold: float = 1.0,
        judge: Callable[[Rollout], bool] | None = None,
        **fields: Any,
    ) -> EvalReport:
        """The report of ``rollouts``; ``judge(rollout)`` decides right/wrong instead of the threshold."""
        rewards = [rollout.final_reward if rollout.final_reward is not None else 0.0 for rollout in rollouts]
        right = [
            judge(rollout) if judge is not None else reward >= success_threshold
            for rollout, reward in zip(rollouts, rewards, strict=True)
        ]
        llm_calls = [call for rollout in rollouts for call in rollout.llm_calls]
        tool_calls = [call for rollout in rollouts for call in rollout.calls if call.kind == "tool"]
        errors = sum(1 for call in tool_calls if call.status == "error")
        prompt_tokens, completion_tokens = _tokens(llm_calls)
        failed = [rollout for rollout in rollouts if rollout.status != "succeeded"]
        by_task: dict[str | None, list[tuple[float, bool]]] = collections.defaultdict(list)
        for rollout, reward, correct in zip(rollouts, rewards, right, strict=True):
            by_task[rollout.task_id].append((reward, bool(correct)))
        per_task = {
            task_id: TaskResult(
                task_id=task_id,
                reward=statistics.fmean(reward for reward, _ in results),
                accuracy=statistics.fmean(float(correct) for _, correct in results),
                rollouts=len(results),
            )
            for task_id, results in by_task.items()
        }
        versions = sorted(
            {str(call.metadata["model_version"]) for call in llm_calls if call.metadata.get("model_version")}
        )
        return cls(
            name=name,
            model=model,
            model_version=fields.pop("model_version", None) or (",".join(versions) if versions else None),
            rollouts=len(rollouts),
            tasks=len(per_task),
            success_threshold=success_threshold,
            reward=bootstrap_mean_interval(rewards),
            accuracy=wilson_interval(sum(1 for value in right if value), len(rollouts)),
            status=dict(collections.Counter(rollout.status for rollout in rollouts)),
            llm_calls=len(llm_calls),
            calls_by_role=dict(collections.Counter(str(call.role) for call in llm_calls)),
            tool_calls=len(tool_calls),
            tool_errors=errors,
            tool_error_rate=errors / len(tool_calls) if tool_calls else None,
            tool_calls_by_name=dict(collections.Counter(str(call.name) for call in tool_calls)),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            failures=[
                Failure(
                    task_id=rollout.task_id,
                    status=rollout.status,
                    error=f"{rollout.error.type}: {rollout.error.message}" if rollout.error else None,
                )
                for rollout in failed[:MAX_FAILURES_LISTED]
            ],
            per_task=list(per_task.values()),
            rollout_records=list(rollouts),
            **fields,
        )

    def save(self, path: str | Path) -> Path:
        """Write the report as JSON (written whole, then renamed into place)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_text(self.model_dump_json(indent=2) + "\n", encoding="utf-8")
        temporary.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> EvalReport:
        """A report saved by :meth:`save`; a file that is not one is a ``ValueError`` naming it."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no evaluation report at {str(path)!r}")
        try:
            return cls.model_validate(json.loads(path.read_text(encoding="utf-8")))
        except ValueError as exc:
            raise ValueError(f"{path}: not an evaluation report ({exc})") from None

    def summary(self) -> str:
        """A few lines for a terminal."""
        roles = ", ".join(f"{role} {count}" for role, count in sorted(self.calls_by_role.items())) or "none"
        tool_rate = "-" if self.tool_error_rate is None else f"{self.tool_error_rate:.3f}"
        statuses = ", ".join(f"{count} {status}" for status, count in sorted(self.status.items()))
        return "\n".join(
            [
                f"{self.name} ({self.model}, version {self.model_version}): {self.rollouts} rollouts of "
                f"{self.tasks} tasks in {self.seconds:.0f} s ({statuses})",
                f"accuracy {self.accuracy.text()} (Wilson 95%), mean reward {self.reward.text()} (bootstrap 95%)",
                f"LLM calls {self.llm_calls} ({roles}); tool calls {self.tool_calls}, failed {self.tool_errors} "
                f"(rate {tool_rate}); tokens {self.prompt_tokens} prompt + {self.completion_tokens} completion",
            ]
        )


class Comparison(BaseModel):
    """``after - before`` for accuracy and mean reward, with 95% intervals."""

    before: str
    after: str
    paired: bool = Field(description="Both scored the same tasks: intervals over the per-task differences.")
    tasks: int
    accuracy: Interval
    reward: Interval

    def summary(self) -> str:
        """A few lines for a terminal."""
        kind = f"paired over {self.tasks} tasks" if self.paired else "unpaired (different tasks)"
        return "\n".join(
            [
                f"{self.after} - {self.before} ({kind}):",
                f"accuracy {self.accuracy.value:+.3f} [{self.accuracy.low:+.3f}, {self.accuracy.high:+.3f}] "
                f"({self.accuracy.method} 95%)",
                f"mean reward {self.reward.value:+.3f} [{self.reward.low:+.3f}, {self.reward.high:+.3f}] "
                f"({self.reward.method} 95%)",
            ]
        )


def compare(before: EvalReport, after: EvalReport) -> Comparison:
    """How ``after`` differs from ``before``: paired over tasks when both scored the same task ids (one result per
    task), else as independent samples (Newcombe for accuracy, a bootstrap for reward)."""
    first = {result.task_id: result for result in before.per_task}
    second = {result.task_id: result for result in after.per_task}
    paired = bool(first) and set(first) == set(second) and None not in first
    if paired:
        ids = sorted(first, key=str)
        accuracy = paired_difference([first[i].accuracy for i in ids], [second[i].accuracy for i in ids])
        reward = paired_difference([first[i].reward for i in ids], [second[i].reward for i in ids])
    else:
        if not first or not second:
            raise ValueError("compare: a report has no per-task results")
        accuracy = newcombe_difference(before.accuracy, len(first), after.accuracy, len(second))
        reward = unpaired_mean_difference([r.reward for r in first.values()], [r.reward for r in second.values()])
    return Comparison(
        before=before.name,
        after=after.name,
        paired=paired,
        tasks=len(first) if paired else len(first) + len(second),
        accuracy=accuracy,
        reward=reward,
    )


def _tokens(calls: Sequence[Any]) -> tuple[int, int]:
    """Prompt and completion tokens: the captured token ids, else the usage the endpoint reported."""
    prompt = completion = 0
    for call in calls:
        usage = call.metadata.get("usage") or {}
        if call.prompt_token_ids is not None:
            prompt += len(call.prompt_token_ids)
        else:
            prompt += int(usage.get("prompt_tokens") or 0)
        if call.completion_token_ids is not None:
            completion += len(call.completion_token_ids)
        else:
            completion += int(usage.get("completion_tokens") or 0)
    return prompt, completion
