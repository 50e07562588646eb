"""Heavy ML: the GRPO trainer on TRL and the model backends (Hugging Face in-process, vLLM); and ``agl.train``, their
front door (loaded by ``import agentlightning`` on first use, the trainer's modules when it is called)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Unpack

from agentlightning.trainers import _deepspeed_notice

if TYPE_CHECKING:
    from agentlightning.trainers.config import TrainConfig, TrainOptions, TrainResult

_deepspeed_notice.install()  # before any trainer module imports transformers (and so DeepSpeed)


def train(
    agent: Any,
    dataset: Sequence[Any],
    roles: Sequence[str] | None = None,
    *,
    val_dataset: Sequence[Any] | None = None,
    config: TrainConfig | None = None,
    **options: Unpack[TrainOptions],
) -> TrainResult:
    """Train the LLM inside ``agent`` (an ``@agl.rollout`` function) on ``dataset`` (a list of tasks).

    ``roles`` selects the roles whose LLM calls are trained (globs; default: the agent's ``roles``, else all).
    ``val_dataset`` is evaluated before training, every ``val_every`` steps and at the end. Every other setting is
    a field of :class:`~agentlightning.trainers.config.TrainConfig` (``agl.TrainConfig``), given as ``config=`` or
    as keywords of the same names (``model="smollm2"``, ``group_size=8``, ``max_steps=50``, ``lora=True``,
    ``output_dir=...``; typed by ``TrainOptions``, so an editor completes them); keywords replace the fields of
    ``config``.
    """
    from agentlightning.trainers.config import TrainConfig
    from agentlightning.trainers.loop import TrainingRun

    fields: dict[str, Any] = dict(options)
    if roles is not None:
        fields["roles"] = roles
    return TrainingRun(agent, dataset, TrainConfig.from_options(config, fields), val_dataset=val_dataset).run()
