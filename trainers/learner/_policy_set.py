"""The trainers of a run, one per policy; a single-policy run is a set of one.

:class:`PolicySet` holds one :class:`~agentlightning.trainers.learner.grpo.LightningGRPOTrainer` per policy. A run
without ``policies=`` has one, named None, over the whole model (or its one LoRA adapter). With ``policies=`` the
base model is wrapped once with every policy's adapter (``peft``'s ``add_adapter``) and each policy's trainer has an
optimizer that holds only that adapter's parameters (own optimizer state, own learning rate, own scheduler and
update count). :meth:`PolicySet.update` is one training step either way: each policy's transitions are packed and
trained apart (a policy without signal is skipped), and the backend serves each updated policy under its next
version (``v<its update count>``).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentlightning.trainers._pipeline import timed
from agentlightning.trainers.learner.batch import pack
from agentlightning.trainers.policies import PolicyMap

from agentlightning.types import Rollout, Transition

if TYPE_CHECKING:
    from agentlightning.trainers.backends.base import Backend
    from agentlightning.trainers.learner._distributed import Ranks
    from agentlightning.trainers.learner.batch import PackedBatch
    from agentlightning.trainers.learner.grpo import LightningGRPOTrainer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class UpdateOptions:
    """How :meth:`PolicySet.update` packs and trains a step's transitions."""

    max_prompt_length: int | None = None
    max_completion_length: int | None = None
    drop_zero_variance_groups: bool = True
    """Drop groups whose rewards all tie (group-baseline algorithms: their advantages are all zero)."""
    asynchronous: bool = False
    """Rollouts keep running during the update (``max_staleness > 0``)."""


class PolicySet:
    """The trainers of a run by policy name (None: the single policy of a run without ``policies=``), on one
    ``model`` and ``tokenizer``; ``policies`` maps the agent's roles to them."""

    def __init__(
        self,
        trainers: Mapping[str | None, LightningGRPOTrainer],
        model: Any,
        tokenizer: Any,
        policies: PolicyMap | None = None,
    ) -> None:
        if (policies is None) != (list(trainers) == [None]):
            raise ValueError(f"PolicySet: trainers {list(trainers)} do not match policies {policies}")
        self.trainers = dict(trainers)
        self.model, self.processing_class, self.policies = model, tokenizer, policies

    @classmethod
    def of_one(cls, model: Any, tokenizer: Any, args: Any, peft_config: Any = None) -> PolicySet:
        """One trainer over ``model`` (wrapped with ``peft_config``'s LoRA adapter when given); ``args`` is its
        ``GRPOConfig``."""
        from agentlightning.trainers.learner.grpo import LightningGRPOTrainer

        trainer = LightningGRPOTrainer(model, args, tokenizer, peft_config=peft_config)
        return cls({None: trainer}, trainer.model, tokenizer)

    @classmethod
    def of_adapters(
        cls, model: Any, tokenizer: Any, policies: PolicyMap, adapters: Mapping[str, Any], args: Mapping[str, Any]
    ) -> PolicySet:
        """One trainer per policy of ``policies``, over adapters ``adapters`` (policy -> ``peft.LoraConfig``) on
        ``model``; ``args`` are each policy's ``GRPOConfig``."""
        from agentlightning.trainers.learner.grpo import LightningGRPOTrainer
        from peft import PeftModel, get_peft_model

        if isinstance(model, PeftModel):
            raise ValueError("agl.train(policies=...): give the base model; each policy adds its own LoRA adapter")
        names = list(policies.policies)
        peft_model = get_peft_model(model, adapters[names[0]], adapter_name=names[0])
        for name in names[1:]:
            peft_model.add_adapter(name, adapters[name])
        trainers: dict[str | None, LightningGRPOTrainer] = {}
        for name in names:
            peft_model.set_adapter(name)  # only this adapter requires grad: the optimizer built now holds it alone
            trainers[name] = LightningGRPOTrainer(peft_model, args[name], tokenizer)
        return cls(trainers, peft_model, tokenizer, policies)

    @property
    def first(self) -> LightningGRPOTrainer:
        """The first trainer: the only one of a single-policy run (the one that runs across processes)."""
        return next(iter(self.trainers.values()))

    @property
    def steps(self) -> dict[str | None, int]:
        """Each policy's update count (its version is ``v<count>``)."""
        return {name: trainer.state.global_step for name, trainer in self.trainers.items()}

    @property
    def trained_version(self) -> int | dict[str, int]:
        """The update count of a single policy, or each policy's (what rollouts' staleness is measured against)."""
        if self.policies is None:
            return self.first.state.global_step
        return {str(name): steps for name, steps in self.steps.items()}

    def step(self, name: str | None, batch: PackedBatch, **options: Any) -> dict[str, float]:
        """One update of policy ``name`` on ``batch`` (with several policies, only its adapter changes)."""
        if name is not None:
            self.model.set_adapter(name)
        return self.trainers[name].step(batch, **options)

    def update(
        self,
        transitions: list[Transition],
        backend: Backend,
        options: UpdateOptions,
        ranks: Ranks | None = None,
    ) -> dict[str, Any]:
        """Train every policy with signal in ``transitions``; ``backend`` serves each new version. Returns the step's
        metrics (``train/...``, ``batch/...``; with several policies ``policy/<name>/...`` each). Under
        ``accelerate launch`` ``ranks`` sends each batch to the other ranks first."""
        row: dict[str, Any] = {}
        pad = int(self.processing_class.pad_token_id)
        updated = 0
        for name, trainer in self.trainers.items():
            own = transitions if self.policies is None else [t for t in transitions if self._policy(t) == name]
            prefix = "" if name is None else f"policy/{name}/"
            if name is not None:
                row[prefix + "transitions"] = len(own)
                if own:
                    row[prefix + "reward"] = statistics.fmean(t.reward for t in own)
            batch = (
                pack(
                    own,
                    pad,
                    options.max_prompt_length,
                    options.max_completion_length,
                    drop_zero_variance_groups=options.drop_zero_variance_groups,
                )
                if own
                else None
            )
            if batch is not None:
                row.update({f"{prefix}batch/{key}": value for key, value in batch.stats.as_dict().items()})
            if batch is None or len(batch) == 0:
                row[prefix + "skipped_update"] = 1
            else:
                if ranks is not None:
                    ranks.send_step(trainer, batch)  # every rank trains on its shard of the batch
                row.update(self._train(name, trainer, batch, backend, options, prefix))
                updated += 1
            if name is not None:
                row[prefix + "model_version"] = f"v{trainer.state.global_step}"
        if not updated:
            row["skipped_update"] = 1  # the step still counts: the optimizer schedule and the versions do not move
        if self.policies is not None:
            row["policies_updated"] = updated
        return row

    def _train(
        self,
        name: str | None,
        trainer: LightningGRPOTrainer,
        batch: PackedBatch,
        backend: Backend,
        options: UpdateOptions,
        prefix: str,
    ) -> dict[str, Any]:
        """One update of policy ``name``, served by ``backend`` as its next version afterwards."""
        version = f"v{trainer.state.global_step + 1}"

        def updating() -> Any:
            return backend.updating(version) if name is None else backend.updating(version, policy=name)

        row: dict[str, Any] = {}
        # With a LoRA reference (the disabled adapter, for the KL term) the forward passes change what a backend
        # generating from these weights would see.
        adapter_reference = trainer.beta != 0.0 and trainer.ref_model is None
        if options.asynchronous and backend.generates_during_update and not adapter_reference:
            # Rollouts keep generating through the forward and backward passes; only the optimizer step pauses them.
            pauses: list[float] = []
            metrics = self.step(name, batch, weights_changing=lambda: timed(updating(), pauses))
            synced = time.perf_counter()
            row[prefix + "async/pause_seconds"] = sum(pauses)  # the optimizer step waiting for the calls in flight
        else:
            with updating():
                metrics = self.step(name, batch)
                synced = time.perf_counter()
        row[prefix + "sync_seconds"] = time.perf_counter() - synced  # pushing the weights to the backend (vLLM)
        if backend.last_logprob_gap is not None:
            row[prefix + "sync/logprob_gap"] = backend.last_logprob_gap  # largest |sampler - trainer| logprob
        row.update({f"{prefix}train/{key}": value for key, value in metrics.items()})
        return row

    def _policy(self, transition: Transition) -> str | None:
        assert self.policies is not None
        return self.policies.policy_of(transition.role)

    def rewards(self, rollouts: list[Rollout], credit: Any, air: Any) -> dict[str, float]:
        """Each policy's mean credited reward over ``rollouts`` (per rollout, then averaged): with a per-policy
        credit, what each policy is rewarded for (``policy/<name>/reward``). Empty for a single policy."""
        from agentlightning.rl.transitions import extract_transitions

        if self.policies is None:
            return {}
        rows = extract_transitions(
            rollouts,
            self.policies.trained_roles,
            self.policies.credit(credit),
            air,
            missing_reward=0.0,
            failed="include",
        ).transitions
        metrics = {}
        for name in self.trainers:
            per_rollout: dict[str, list[float]] = {}
            for row in rows:
                if self.policies.policy_of(row.role) == name:
                    per_rollout.setdefault(row.rollout_id, []).append(row.reward)
            if per_rollout:
                metrics[f"policy/{name}/reward"] = statistics.fmean(statistics.fmean(v) for v in per_rollout.values())
        return metrics
