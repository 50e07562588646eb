"""Training across processes: ``agl.train`` under ``accelerate launch`` (DDP over the GPUs of one or more machines).

Every rank runs the same script. TRL's ``TrainingArguments`` set up the process group (so ``trainer_args`` such as
``ddp_backend`` and ``ddp_timeout`` apply) and :class:`~agentlightning.trainers.grpo.LightningGRPOTrainer` wraps its
model in ``DistributedDataParallel``. Then:

- rank 0 owns the run: the Lightning Server, the model backend, the workers and the rollout pipeline; it writes
  metrics and checkpoints and shows progress. The other ranks build the same model and trainer, load the same
  checkpoint, and wait in :meth:`Ranks.follow`;
- for each update rank 0 broadcasts the packed batch; every rank calls ``trainer.step(batch)``, which trains on the
  rank's shard (:func:`shard`) and lets DDP average the gradients, so the update is the single-process update on
  the whole batch (up to float rounding) and every rank holds the same weights afterwards. Rank 0's backend then
  serves them (the Hugging Face backend generates from rank 0's live model).

DeepSpeed and FSDP shard the weights and optimizer state across ranks; the backend's weight sync and the
checkpoints read them whole on rank 0, so those configs are refused with an explanation (see ``docs/scaling.md``),
with one process too (where TRL would otherwise ignore them, the model never being prepared for them).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from agentlightning.trainers.batch import PackedBatch
    from agentlightning.trainers.config import TrainResult

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
        prompt_ids=batch.prompt_ids[take], prompt_mask=batch.prompt_mask[take],
        completion_ids=batch.completion_ids[take], completion_mask=batch.completion_mask[take],
        advantages=batch.advantages[take], weights=batch.weights[take],
        old_logprobs=None if batch.old_logprobs is None else batch.old_logprobs[take],
        rollout_ids=[batch.rollout_ids[i] for i in index], call_ids=[batch.call_ids[i] for i in index],
        group_ids=[batch.group_ids[i] for i in index], model_versions=[batch.model_versions[i] for i in index],
    )
    padding = slice(len(real), per_rank)
    part.completion_mask[padding] = 0
    part.advantages[padding] = 0.0
    part.weights[padding] = totals.mean_weight
    return part, totals


def wrap_model(trainer: Any) -> Any:
    """``trainer``'s model for the update: DDP-wrapped (accelerate's ``prepare_model``) when run across processes."""
    accelerator = trainer.accelerator
    if trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled:
        engine = "DeepSpeed" if trainer.is_deepspeed_enabled else "FSDP"
        raise NotImplementedError(
            f"agl.train trains with DDP; this run is configured for {engine}, "
            "which shards the weights and optimizer state across ranks, while the model backend on rank 0 serves "
            "(and the checkpoints save) rank 0's whole copy. Launch with a multi-GPU (DDP) accelerate config, e.g. "
            "`accelerate launch --multi_gpu --num_processes 8 train.py`, and use lora=True for large models; see "
            "docs/scaling.md"
        )
    if accelerator.num_processes == 1:
        return trainer.model_wrapped
    return accelerator.prepare_model(trainer.model)


def mean_over_ranks(value: float, trainer: Any) -> float:
    """``value`` averaged over the ranks (every rank must call this)."""
    if trainer.accelerator.num_processes == 1:
        return value
    tensor = torch.tensor(value, dtype=torch.float64, device=trainer.accelerator.device)
    return float(trainer.accelerator.reduce(tensor, reduction="mean"))


class Ranks:
    """This process's place in an ``accelerate launch`` (a single process is rank 0 of 1) and the messages rank 0
    sends the other ranks: ``("step", batch)``, ``("done", result)`` or ``("abort", reason)``."""

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
            elif kind == "done":
                return dataclasses.replace(payload, model=trainer.model, tokenizer=tokenizer)
            else:
                raise RuntimeError(f"rank {self.index}: rank 0 stopped the run: {payload}")
