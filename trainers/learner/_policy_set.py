"""The trainers of a multi-policy run: one LoRA adapter per policy on one PEFT model, one GRPO trainer per adapter.

:class:`PolicySet` wraps the base model once with every policy's adapter (``peft``'s ``add_adapter``) and builds a
:class:`~agentlightning.trainers.learner.grpo.LightningGRPOTrainer` per policy whose optimizer holds only that adapter's
parameters (own optimizer state, own learning rate, own scheduler and update count). :meth:`PolicySet.update` is one
training step: each policy's transitions are packed and trained apart (a policy without signal is skipped), and the
backend serves each updated adapter under that policy's next version (``v<its update count>``).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Mapping
from typing import Any

from agentlightning.trainers.learner.batch import pack
from agentlightning.trainers.policies import PolicyMap

from agentlightning.rl.advantages import GROUP_BASELINES
from agentlightning.types import Rollout, Transition

logger = logging.getLogger(__name__)


class PolicySet:
    """One :class:`~agentlightning.trainers.learner.grpo.LightningGRPOTrainer` per policy of ``policies``, over adapters
    ``adapters`` (policy -> ``peft.LoraConfig``) on ``model``; ``args`` are each policy's ``GRPOConfig``."""

    def __init__(
        self, model: Any, tokenizer: Any, policies: PolicyMap, adapters: Mapping[str, Any], args: Mapping[str, Any]
    ) -> None:
        from agentlightning.trainers.learner.grpo import LightningGRPOTrainer
        from peft import PeftModel, get_peft_model

        if isinstance(model, PeftModel):
            raise ValueError("agl.train(policies=...): give the base model; each policy adds its own LoRA adapter")
        names = list(policies.policies)
        peft_model = get_peft_model(model, adapters[names[0]], adapter_name=names[0])
        for name in names[1:]:
            peft_model.add_adapter(name, adapters[name])
        self.model, self.processing_class, self.policies = peft_model, tokenizer, policies
        self.trainers: dict[str, LightningGRPOTrainer] = {}
        for name in names:
            peft_model.set_adapter(name)  # only this adapter requires grad: the optimizer built now holds it alone
            self.trainers[name] = LightningGRPOTrainer(peft_model, args[name], tokenizer)

    @property
    def steps(self) -> dict[str, int]:
        """Each policy's update count (its version is ``v<count>``)."""
        return {name: trainer.state.global_step for name, trainer in self.trainers.items()}

    def step(self, name: str, batch: Any) -> dict[str, float]:
        """One update of policy ``name`` on ``batch`` (only its adapter changes)."""
        self.model.set_adapter(name)
        return self.trainers[name].step(batch)

    def update(
        self,
        transitions: list[Transition],
        backend: Any,
        max_prompt_length: int | None,
        max_completion_length: int | None,
        algorithm: str,
    ) -> dict[str, Any]:
        """Train every policy with signal in ``transitions`` (advantages computed per policy with ``algorithm``);
        ``backend`` serves each new adapter under its new version. Returns the step's per-policy metrics
        (``policy/<name>/...``)."""
        row: dict[str, Any] = {}
        pad = int(self.processing_class.pad_token_id)
        updated = 0
        for name, trainer in self.trainers.items():
            own = [t for t in transitions if self.policies.policy_of(t.role) == name]
            prefix = f"policy/{name}/"
            row[prefix + "transitions"] = len(own)
            if own:
                row[prefix + "reward"] = statistics.fmean(t.reward for t in own)
            batch = (
                pack(
                    own,
                    pad,
                    max_prompt_length,
                    max_completion_length,
                    drop_zero_variance_groups=algorithm in GROUP_BASELINES,
                )
                if own
                else None
            )
            if batch is None or len(batch) == 0:
                row[prefix + "skipped_update"] = 1
                row[prefix + "model_version"] = f"v{trainer.state.global_step}"
                continue
            started = time.perf_counter()
            with backend.updating(f"v{trainer.state.global_step + 1}", policy=name):
                metrics = self.step(name, batch)
            row[prefix + "sync_seconds"] = time.perf_counter() - started - metrics.get("update_seconds", 0.0)
            row.update({f"{prefix}train/{key}": value for key, value in metrics.items()})
            row.update({f"{prefix}batch/{key}": value for key, value in batch.stats.as_dict().items()})
            row[prefix + "model_version"] = f"v{trainer.state.global_step}"
            updated += 1
        if not updated:
            logger.warning(
                "no policy had anything to train on this step (every group had equal rewards, was too "
                "stale or no tokens were captured): the adapters are unchanged"
            )
            row["skipped_update"] = 1
        row["policies_updated"] = updated
        return row

    def rewards(self, rollouts: list[Rollout], credit: Any, air: Any) -> dict[str, float]:
        """Each policy's mean credited reward over ``rollouts`` (per rollout, then averaged): with a per-policy
        credit, what each policy is rewarded for (``policy/<name>/reward``)."""
        from agentlightning.rl.transitions import extract_transitions

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
