"""The rollout pipeline of ``agl.train``: GRPO groups run ahead of the trainer by up to ``max_staleness`` steps.

At the start of each step the pipeline tops its groups (one task's ``group_size`` rollouts) up to
``(max_staleness + 1) * tasks_per_step`` submitted and not yet used (no more than the steps left need). With
``max_staleness=0`` that is the synchronous loop: a step's groups start once the previous update is done. With
``K > 0`` the groups of the next ``K`` steps run while this step trains. A step takes groups in the order they
were submitted (waiting for the oldest while the younger ones run on) until it has ``tasks_per_step`` of them, so
that its batch is not biased towards the groups that finish first (short answers, fewer tool calls); a transition
sampled with model version ``v`` is kept for the update of version ``s`` only if ``s - v <= K`` (otherwise dropped
and counted). With dynamic sampling
(``refill_cap > 0``), a group without a learning signal (all rewards equal, nothing trainable, or only stale
transitions) is set aside and a new task is sampled at once, at most ``refill_cap`` times a step (DAPO's dynamic
sampling): the step takes the next group in line, and the groups of the steps ahead stay as many as before
(without the replacement, the next step would find one of its groups taken and wait for a new one). With several
policies (``policy_of``: role -> policy), each policy's transitions get their own group statistics and staleness
(against that policy's version).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, wait
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, cast

from agentlightning.trainers.reporting import STEP_WARNING

from agentlightning.rl.advantages import GROUP_BASELINES, Estimator, compute_advantages, group_key
from agentlightning.rl.transitions import ExtractionStats, extract_transitions
from agentlightning.types import Rollout, Transition

logger = logging.getLogger(__name__)

PROGRESS_SECONDS = 10.0
"""How often a step still waiting for its rollouts logs where they stand (INFO)."""


@contextmanager
def timed(context: AbstractContextManager[Any], seconds: list[float]) -> Iterator[None]:
    """``context``, appending to ``seconds`` how long entering it took (e.g. a pause waiting for calls in flight)."""
    started = time.perf_counter()
    with context:
        seconds.append(time.perf_counter() - started)
        yield


def version_number(version: str | None) -> int | None:
    """``"v3"`` -> 3 (the loop's versions are ``v<global step>``); None for anything else."""
    if isinstance(version, str) and version.startswith("v") and version[1:].isdigit():
        return int(version[1:])
    return None


def fresh_enough(
    transitions: Sequence[Transition], trained_version: int | Callable[[Transition], int], max_staleness: int
) -> tuple[list[Transition], list[int]]:
    """The transitions whose sampling version is at most ``max_staleness`` behind ``trained_version`` (or the
    version it gives for a transition: its policy's), and the lags of those kept. A transition without a ``v<N>``
    version is kept (its lag is unknown; counted as 0)."""
    kept, lags = [], []
    for row in transitions:
        sampled = version_number(row.model_version)
        trained = trained_version(row) if callable(trained_version) else trained_version
        lag = 0 if sampled is None else trained - sampled
        if lag <= max_staleness:
            kept.append(row)
            lags.append(lag)
    return kept, lags


@dataclass
class StepData:
    """What one training step gets from the pipeline."""

    rollouts: list[Rollout]
    transitions: list[Transition]
    """Transitions of the used groups with advantages, stale ones removed."""
    metrics: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    """What extraction skipped or fell back on in this step's groups, in plain words (also logged)."""


@dataclass
class _Group:
    index: int  # dataset index of the task
    future: Future[list[Rollout]]


class RolloutPipeline:
    """Feeds each training step with finished groups from ``source`` (see the module docstring).

    ``pick(n)`` returns the dataset indices of the next ``n`` tasks; ``backlog`` are indices to run first (the
    groups that were in flight when the checkpoint being resumed was written).
    """

    def __init__(
        self,
        source: Any,
        dataset: Sequence[Any],
        pick: Callable[[int], list[int]],
        *,
        tasks_per_step: int,
        group_size: int,
        max_staleness: int,
        refill_cap: int,
        timeout: float | None,
        roles: Any,
        credit: Any,
        air: Any,
        algorithm: str,
        backlog: Sequence[int] = (),
        max_steps: int | None = None,
        policy_of: Callable[[str | None], str | None] | None = None,
    ) -> None:
        self.source, self.dataset, self.pick = source, dataset, pick
        self.tasks_per_step, self.group_size, self.max_staleness = tasks_per_step, group_size, max_staleness
        self.refill_cap, self.timeout = refill_cap, timeout
        self.roles, self.credit, self.air = roles, credit, air
        self.algorithm = cast(Estimator, algorithm)  # one of ESTIMATORS: TrainConfig checks it
        self.max_steps = max_steps
        self.policy_of = policy_of
        self.progress_seconds = PROGRESS_SECONDS
        self.filtering = refill_cap > 0  # set groups without signal aside (else pack drops the flat ones)
        self.pending: list[_Group] = []
        self._backlog = collections.deque(backlog)
        self._lock = threading.Lock()
        self._running = 0
        self._idle_since: float | None = None  # since when no submitted rollout has been running
        self._idle = 0.0
        self.dropped_stale_total = 0
        self.refills_total = 0

    def pending_indices(self) -> list[int]:
        """Dataset indices of the groups submitted and not yet used (saved in checkpoints)."""
        return [group.index for group in self.pending]

    def next_step(self, step: int, trained_version: int | Mapping[str, int]) -> StepData:
        """Top up, then wait for the groups of step ``step`` (0-based), which updates ``v<trained_version>`` (per
        policy, with ``policy_of``)."""
        trained = self._trained(trained_version)
        ahead = self.max_staleness if self.max_steps is None else min(self.max_staleness, self.max_steps - 1 - step)
        reserve = max(ahead, 0) * self.tasks_per_step  # groups of the steps ahead, kept in flight
        self._submit(reserve + self.tasks_per_step - len(self.pending), f"step{step}")
        waited, tokens = time.perf_counter(), self.source.progress().completion_tokens
        used: list[tuple[list[Rollout], list[Transition]]] = []
        set_aside: list[tuple[list[Rollout], list[Transition]]] = []
        discarded = refills = dropped = 0
        extracted: list[ExtractionStats] = []
        while len(used) < self.tasks_per_step:
            # A group set aside is replaced at once, so that the steps ahead do not find their groups taken
            short = self.tasks_per_step + reserve - len(used) - len(self.pending)
            if short > 0 and self.filtering and refills < self.refill_cap:  # sample more tasks, all at once
                count = min(short, self.refill_cap - refills)
                refills += count
                self._submit(count, f"step{step}r{refills}")
            if not self.pending:
                break
            group = self.pending.pop(0)  # the oldest; waited for while the younger ones run on
            rollouts = self._result(group, step, (waited, tokens), len(used) + len(set_aside))
            extraction = extract_transitions(rollouts, self.roles, self.credit, self.air)
            extracted.append(extraction.stats)
            fresh = fresh_enough(extraction.transitions, trained, self.max_staleness)[0]
            if not self.filtering or (fresh and self._has_signal(extraction.transitions)):
                used.append((rollouts, extraction.transitions))
            else:
                discarded += 1
                dropped += len(extraction.transitions) - len(fresh)
                set_aside.append((rollouts, extraction.transitions))  # in the step's reward metrics, never trained
        trainer_wait = time.perf_counter() - waited
        warnings = ExtractionStats.combined(extracted).problems()  # counted over the step, not per group
        for line in warnings:
            logger.warning("step %d: %s", step + 1, line, extra={STEP_WARNING: step + 1})
        transitions = self._advantages([row for _, rows in used for row in rows])
        fresh, lags = fresh_enough(transitions, trained, self.max_staleness)
        dropped += len(transitions) - len(fresh)
        self.dropped_stale_total += dropped
        self.refills_total += refills
        with self._lock:
            idle, self._idle = self._idle, 0.0
            if self._idle_since is not None:  # nothing running now: the sampler is waiting for the update
                idle += time.perf_counter() - self._idle_since
                self._idle_since = time.perf_counter()
        metrics = {
            "async/staleness_mean": sum(lags) / len(lags) if lags else 0.0,
            "async/staleness_max": float(max(lags, default=0)),
            "async/dropped_stale": float(dropped),
            "async/dropped_stale_total": float(self.dropped_stale_total),
            "async/groups_used": float(len(used)),
            "async/groups_without_signal": float(discarded),
            "async/refills": float(refills),
            "async/refills_total": float(self.refills_total),
            "async/queue_depth": float(len(self.pending)),
            "async/trainer_wait_seconds": trainer_wait,
            "async/sampler_wait_seconds": idle,
        }
        rollouts = [rollout for group_rollouts, _ in used + set_aside for rollout in group_rollouts]
        return StepData(rollouts, fresh, metrics, warnings)

    def drain(self) -> None:
        """Wait until every submitted group has finished (they stay pending for the next steps)."""
        wait([group.future for group in self.pending])

    def close(self) -> None:
        for group in self.pending:
            group.future.cancel()
        self.pending.clear()

    # -- helpers ------------------------------------------------------------------------------------------------

    def _trained(self, version: int | Mapping[str, int]) -> int | Callable[[Transition], int]:
        """The version an update makes, or per policy: the version its policy's update makes for a transition."""
        if not isinstance(version, Mapping):
            return version
        versions, policy_of = dict(version), self.policy_of or (lambda role: None)
        return lambda row: versions[policy_of(row.role)]  # type: ignore[index]

    def _advantages(self, transitions: list[Transition]) -> list[Transition]:
        """Advantages of ``transitions``, each policy's computed apart (with ``policy_of``)."""
        if self.policy_of is None:
            return compute_advantages(transitions, estimator=self.algorithm)
        by_policy: dict[str | None, list[Transition]] = {}
        for row in transitions:
            by_policy.setdefault(self.policy_of(row.role), []).append(row)
        return [row for rows in by_policy.values() for row in compute_advantages(rows, estimator=self.algorithm)]

    def _has_signal(self, transitions: Sequence[Transition]) -> bool:
        """The group's rewards differ, for some policy (the signal of an estimator centred per group;
        ``reinforce++``'s batch baseline learns from any reward)."""
        if self.algorithm not in GROUP_BASELINES:
            return True
        rewards: dict[tuple[str | None, str], set[float]] = {}
        policy_of = self.policy_of or (lambda role: None)
        for row in transitions:
            rewards.setdefault((policy_of(row.role), group_key(row)), set()).add(row.reward)
        return any(len(values) > 1 for values in rewards.values())

    def _submit(self, count: int, prefix: str) -> None:
        if count <= 0:
            return
        indices = [self._backlog.popleft() for _ in range(min(count, len(self._backlog)))]
        indices += self.pick(count - len(indices))
        futures = self.source.submit([self.dataset[index] for index in indices], self.group_size, prefix, self.timeout)
        with self._lock:
            if self._running == 0 and self._idle_since is not None:
                self._idle += time.perf_counter() - self._idle_since
                self._idle_since = None
            self._running += len(futures)
        for index, future in zip(indices, futures, strict=True):
            self.pending.append(_Group(index, future))
            future.add_done_callback(self._finished)

    def _result(self, group: _Group, step: int, since: tuple[float, int], taken: int) -> list[Rollout]:
        """The rollouts of ``group``, logging a progress line every ``progress_seconds`` while it runs, so that a
        slow step shows it is alive: the step's rollouts finished (``taken`` groups of it are already), running and
        queued, and the completion tokens per second since the step began waiting (``since``: time, tokens)."""
        while not wait([group.future], timeout=self.progress_seconds).done:
            now = self.source.progress()
            seconds = time.perf_counter() - since[0]
            done = taken + sum(1 for other in self.pending if other.future.done())
            logger.info(
                "step %d, %.0f s: %d of %d rollouts finished, %d running, %d queued; %.1f completion tokens/s",
                step + 1,
                seconds,
                done * self.group_size + now.finished,
                (taken + len(self.pending) + 1) * self.group_size,
                now.running,
                now.queued,
                (now.completion_tokens - since[1]) / seconds,
            )
        return group.future.result()

    def _finished(self, _: Future[list[Rollout]]) -> None:
        with self._lock:
            self._running -= 1
            if self._running == 0:
                self._idle_since = time.perf_counter()
