"""Training across processes: ``agl.train`` under ``accelerate launch``, with DDP, FSDP2 or DeepSpeed ZeRO over the
GPUs of one or more machines (or CPU processes over gloo).

Every rank runs the same script. TRL's ``TrainingArguments`` set up the process group (so ``trainer_args`` such as
``ddp_backend`` and ``ddp_timeout`` apply) and :class:`~agentlightning.trainers.learner.grpo.LightningGRPOTrainer`
wraps its model (:func:`wrap_model`). Then:

- rank 0 owns the run: the Lightning Server, the model backend, the workers and the rollout pipeline; it writes
  metrics and checkpoints and shows progress. The other ranks build the same model and trainer, load the same
  checkpoint, and wait in :meth:`Ranks.follow`;
- for each update rank 0 broadcasts the packed batch; every rank calls ``trainer.step(batch)``, which trains on the
  rank's shard (:func:`shard`) and lets DDP (or FSDP's reduce-scatter, or ZeRO's) average the gradients, so the
  update is the single-process update on the whole batch (up to float rounding). Rank 0's backend then serves it:
  under DDP and ZeRO-2 rank 0's live model; under FSDP and ZeRO-3, whose ranks each hold a part of every
  parameter, rank 0's unsharded :class:`ServedCopy`, into which every rank gathers the trained parameters after
  each optimizer step. Checkpoints gather the trained parameters the same way (every rank; see
  :mod:`~agentlightning.trainers.checkpoint`), with the optimizer state (FSDP) or the DeepSpeed engine's own files.

DeepSpeed comes in through accelerate's plugin as in ``transformers.Trainer`` (:func:`_prepare_deepspeed`); its
engine takes the optimizer step inside the backward of the micro-batch that ends the batch, which ``step()`` marks.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from agentlightning.trainers.checkpoint import contribute_checkpoint, full_tensor

if TYPE_CHECKING:
    from agentlightning.trainers.config import TrainConfig, TrainResult
    from agentlightning.trainers.learner.batch import PackedBatch

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchTotals:
    """What a shard's loss is normalised by: the whole batch's rows, completion tokens and mean row weight."""

    rows: int
    tokens: float
    mean_weight: float
    processes: int


def shard(batch: PackedBatch, rank: int, processes: int) -> tuple[PackedBatch, BatchTotals]:
    """Rank ``rank``'s contiguous share of ``batch`` and the whole batch's totals.

    Every rank gets ``ceil(rows / processes)`` rows, so their micro-batches line up (DDP and TRL's metrics run
    collectives per micro-batch). A rank short of rows is padded with copies of a row whose completion mask and
    advantage are zero: they add nothing to the loss, its gradient or TRL's masked metrics.
    """
    rows = len(batch)
    totals = BatchTotals(rows, float(batch.completion_mask.sum()), float(batch.weights.float().mean()), processes)
    if processes == 1:
        return batch, totals
    per_rank = math.ceil(rows / processes)
    start = min(rank * per_rank, rows)
    real = list(range(start, min(start + per_rank, rows)))
    index = real + [real[0] if real else 0] * (per_rank - len(real))
    take = torch.tensor(index)
    part = dataclasses.replace(
        batch,
        prompt_ids=batch.prompt_ids[take],
        prompt_mask=batch.prompt_mask[take],
        completion_ids=batch.completion_ids[take],
        completion_mask=batch.completion_mask[take],
        advantages=batch.advantages[take],
        weights=batch.weights[take],
        old_logprobs=None if batch.old_logprobs is None else batch.old_logprobs[take],
        rollout_ids=[batch.rollout_ids[i] for i in index],
        call_ids=[batch.call_ids[i] for i in index],
        group_ids=[batch.group_ids[i] for i in index],
        model_versions=[batch.model_versions[i] for i in index],
    )
    padding = slice(len(real), per_rank)
    part.completion_mask[padding] = 0
    part.advantages[padding] = 0.0
    part.weights[padding] = totals.mean_weight
    return part, totals


def wrap_model(trainer: Any) -> Any:
    """``trainer``'s model for the update: as it is in one process; DDP-wrapped (accelerate's ``prepare_model``)
    across processes; sharded in place with FSDP2, after rank 0 has kept an unsharded copy of it
    (:class:`ServedCopy`, ``trainer.served_copy``); a DeepSpeed engine under a DeepSpeed config."""
    accelerator = trainer.accelerator
    if trainer.is_deepspeed_enabled:
        return _prepare_deepspeed(trainer)
    plugin = _fsdp_plugin(trainer)
    if plugin is None:
        return trainer.model_wrapped if accelerator.num_processes == 1 else accelerator.prepare_model(trainer.model)
    if plugin.fsdp_version != 2:
        raise NotImplementedError(
            "agl.train shards with FSDP2 only; this accelerate config asks for FSDP1. Set `fsdp_version: 2` in its "
            "fsdp_config; see docs/scaling.md"
        )
    trainer.served_copy = ServedCopy(trainer)
    if trainer.is_fsdp_enabled:  # accelerate shards the model and moves the optimizer onto the shards
        model, optimizer = accelerator.prepare(trainer.model, trainer.optimizer)
        trainer.model, trainer.optimizer = model, optimizer.optimizer  # the torch optimizer
    else:  # CPU ranks, which accelerate 1.15 leaves unsharded: its FSDP2 sharding, then a new optimizer on the shards
        from types import SimpleNamespace

        from accelerate.utils import fsdp2_prepare_model

        view = SimpleNamespace(
            state=SimpleNamespace(fsdp_plugin=plugin),
            device=accelerator.device,
            is_main_process=accelerator.is_main_process,
            mixed_precision=accelerator.mixed_precision,
        )
        model = trainer.model = fsdp2_prepare_model(view, trainer.model)
        trainer.optimizer = trainer.lr_scheduler = None
        trainer.create_optimizer_and_scheduler(num_training_steps=max(trainer.args.max_steps, 1))
    trainer.served_copy.bind(model)
    return model


def deepspeed_launch() -> bool:
    """Whether ``accelerate launch`` configured this process for DeepSpeed."""
    return os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true"


def deepspeed_stage(trainer: Any) -> int | None:
    """The ZeRO stage of ``trainer``'s DeepSpeed engine, or None without DeepSpeed."""
    return trainer.accelerator.state.deepspeed_plugin.zero_stage if trainer.is_deepspeed_enabled else None


def _prepare_deepspeed(trainer: Any) -> Any:
    """``trainer``'s DeepSpeed engine, set up as ``transformers.Trainer`` does: the config's "auto" values from the
    training arguments, the optimizer the config names or else the trainer's, and the trainer's scheduler (stepped
    by ``step()``) unless the config names one. Under ZeRO-3, whose ranks each hold a partition of every
    parameter, rank 0 first keeps an unsharded copy to serve (:class:`ServedCopy`)."""
    from transformers.integrations.deepspeed import deepspeed_init

    accelerator, steps = trainer.accelerator, max(trainer.args.max_steps, 1)
    if deepspeed_stage(trainer) == 3:
        trainer.served_copy = ServedCopy(trainer)
    optimizer, scheduler = deepspeed_init(trainer, num_training_steps=steps)
    if scheduler is None:
        engine, trainer.optimizer = accelerator.prepare(trainer.model, optimizer)
        trainer.lr_scheduler = None
        trainer.create_scheduler(num_training_steps=steps, optimizer=trainer.optimizer)
    else:
        engine, trainer.optimizer, trainer.lr_scheduler = accelerator.prepare(trainer.model, optimizer, scheduler)
    if trainer.served_copy is not None:
        trainer.served_copy.bind(trainer.model)
    return engine


def _fsdp_plugin(trainer: Any) -> Any:
    """The FSDP settings of this launch, or None: accelerate's plugin, or on CPU ranks (where accelerate 1.15 ignores
    an FSDP config and would train DDP) one built from the config ``accelerate launch`` put in the environment."""
    if trainer.is_fsdp_enabled:
        return trainer.accelerator.state.fsdp_plugin
    if trainer.accelerator.num_processes > 1 and os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true":
        from accelerate.utils import FullyShardedDataParallelPlugin

        return FullyShardedDataParallelPlugin()
    return None


def served_model(trainer: Any, config: TrainConfig) -> Any:
    """The model the backend serves and ``agl.train`` returns: ``trainer.model``, or under FSDP rank 0's unsharded
    copy of it, on the training device unless a vLLM backend reads it from files (``disk`` or ``lora`` sync)."""
    copy = getattr(trainer, "served_copy", None)
    if copy is None:
        return trainer.model
    if copy.model is not None and not (config.backend == "vllm" and config.vllm_sync in ("disk", "lora")):
        copy.model.to(trainer.accelerator.device)
    return copy.model


class ServedCopy:
    """Rank 0's unsharded copy of a model that FSDP (or ZeRO-3) shards across the ranks: what the backend serves (the
    HF backend generates from it; vLLM's sync reads it), what the final model saves and what ``agl.train`` returns
    on rank 0.
    Made before sharding; :meth:`refresh` (after each optimizer step, and after loading a checkpoint) gathers the
    parameters that train (the LoRA adapter, or the whole model) into it. Other ranks hold no copy."""

    def __init__(self, trainer: Any) -> None:
        import copy

        self.model = copy.deepcopy(trainer.model) if trainer.accelerator.is_main_process else None
        self._trained: list[tuple[str, Any]] = []
        for module in self.model.modules() if self.model is not None else ():
            # TRL's fused-LM-head forward, set on the instance, calls the original model's (soon sharded) forward:
            # the copy, which only generates, takes its class's own.
            vars(module).pop("forward", None)

    def bind(self, sharded: Any) -> None:
        """Follow the parameters that train in ``sharded`` (the same model, its parameters now shards)."""
        self._trained = [(name, param) for name, param in sharded.named_parameters() if param.requires_grad]
        if self.model is not None:
            own = dict(self.model.named_parameters())
            self._targets = [own[name] for name, _ in self._trained]

    @torch.no_grad()
    def refresh(self) -> None:
        """Copy the sharded model's trained parameters into the copy (every rank must call this)."""
        for index, (_, param) in enumerate(self._trained):
            whole = full_tensor(param)
            if self.model is not None:
                self._targets[index].copy_(whole)


def mean_over_ranks(value: float, trainer: Any) -> float:
    """``value`` averaged over the ranks (every rank must call this)."""
    if trainer.accelerator.num_processes == 1:
        return value
    tensor = torch.tensor(value, dtype=torch.float64, device=trainer.accelerator.device)
    return float(trainer.accelerator.reduce(tensor, reduction="mean"))


class Ranks:
    """This process's place in an ``accelerate launch`` (a single process is rank 0 of 1) and the messages rank 0
    sends the other ranks: ``("step", batch)``, ``("checkpoint", directory)`` (FSDP, DeepSpeed: help save it),
    ``("done", result)`` or ``("abort", reason)``."""

    def __init__(self) -> None:
        from accelerate import PartialState

        state = PartialState()  # initialised by TRL's TrainingArguments with their backend and timeout
        self.index, self.count, self.main = state.process_index, state.num_processes, state.is_main_process
        self._step_ends_at: int | None = None  # rank 0: the global step at which the step last sent is complete

    def share(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank (every rank must call this)."""
        if self.count == 1:
            return value
        from accelerate.utils import broadcast_object_list

        return broadcast_object_list([value])[0]

    def resume_path(self, chosen: Path | None) -> Path | None:
        """The checkpoint rank 0 resumes from (``chosen`` there), checked to exist on this rank's filesystem."""
        path = self.share(chosen)
        if path is not None and not self.main and not (Path(path) / "state.json").exists():
            raise FileNotFoundError(
                f"rank {self.index}: rank 0 resumes from {path}, which this machine cannot read; across machines "
                "output_dir must be on a filesystem every rank sees"
            )
        return path

    def send_step(self, trainer: Any, batch: PackedBatch) -> None:
        """On rank 0, before ``trainer.step(batch)``: the other ranks take the same step."""
        if self.main and self.count > 1:
            self._step_ends_at = trainer.state.global_step + trainer.num_iterations
            self.share(("step", batch))

    def send_checkpoint(self, trainer: Any, directory: Path) -> None:
        """On rank 0, saving a checkpoint into ``directory`` of a model sharded by FSDP or trained by DeepSpeed: the
        other ranks help gather it, and write their partitions of the DeepSpeed engine's state."""
        if self.main and self.count > 1 and (trainer.served_copy is not None or trainer.is_deepspeed_enabled):
            self.share(("checkpoint", directory))

    def finish(self, result: TrainResult) -> None:
        """On rank 0 at the end of the run: the other ranks return ``result`` (with their own model)."""
        if self.main and self.count > 1:
            self.share(("done", dataclasses.replace(result, model=None, tokenizer=None)))

    def abort(self, trainer: Any, error: BaseException) -> None:
        """On rank 0 when the run fails: the other ranks raise instead of waiting. Not while they are inside a step
        (in its collectives): then the launcher ends them when this process exits with the error."""
        if self.main and self.count > 1 and trainer.state.global_step >= (self._step_ends_at or 0):
            self.share(("abort", f"{type(error).__name__}: {error}"))

    def follow(self, trainer: Any, tokenizer: Any) -> TrainResult:
        """On ranks other than 0: take every step rank 0 sends until it finishes; return its result."""
        logger.debug("rank %d of %d: following rank 0", self.index, self.count)
        while True:
            kind, payload = self.share(None)
            if kind == "step":
                trainer.step(payload)
            elif kind == "checkpoint":
                contribute_checkpoint(trainer, payload)
            elif kind == "done":
                return dataclasses.replace(payload, model=trainer.model, tokenizer=tokenizer)
            else:
                raise RuntimeError(f"rank {self.index}: rank 0 stopped the run: {payload}")
