"""Checkpoints of a training run: trainable weights, optimizer, scheduler, loop state; resume from the latest.

Layout: ``<output_dir>/checkpoints/step-<N>/`` with ``trainable.pt`` (the parameters that train: the LoRA adapter
or the whole model), ``optimizer.pt``, ``scheduler.pt`` and ``state.json`` (step, model version, task sampler,
RNG state). With several policies (:class:`~agentlightning.trainers.learner._policy_set.PolicySet`), each policy's
adapter, optimizer and scheduler are in ``policies/<name>/`` with its own ``trainer_state.json`` (its update count). A
checkpoint directory appears only once complete (written under a temporary name, then renamed). Under FSDP the
weights and optimizer state are gathered whole (:func:`trained_state`, on every rank) and saved in the same layout,
so a checkpoint resumes with or without sharding. Under DeepSpeed the weights are gathered the same way, and the
optimizer state (ZeRO-partitioned, with its fp32 master weights) is the engine's own checkpoint in ``deepspeed/``,
written by every rank: it resumes under DeepSpeed with the same number of processes.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)

_ENGINE_TAG = "engine"  # the tag of a DeepSpeed engine's checkpoint within ``deepspeed/``


def checkpoint_root(output_dir: Path) -> Path:
    return output_dir / "checkpoints"


def latest_checkpoint(output_dir: Path) -> Path | None:
    """The newest complete checkpoint under ``output_dir``, or None."""
    root = checkpoint_root(output_dir)
    if not root.exists():
        return None
    found = [path for path in root.glob("step-*") if (path / "state.json").exists()]
    return max(found, key=lambda path: int(path.name.split("-")[1]), default=None)


def save_checkpoint(
    trainer: Any,
    output_dir: Path,
    state: dict[str, Any],
    keep: int = 2,
    notify: Callable[[Path], None] | None = None,
) -> Path:
    """Write a checkpoint for ``state['step']`` and keep only the newest ``keep``. ``notify(directory)`` is called
    once the (temporary) directory exists, before the state is gathered: there the other ranks join
    (:func:`contribute_checkpoint`)."""
    root = checkpoint_root(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{state['step']}"
    temporary = root / f".step-{state['step']}.tmp"
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir()
    if notify is not None:
        notify(temporary)
    for folder, unit in _units(trainer):
        directory = temporary / folder
        directory.mkdir(parents=True, exist_ok=True)
        weights, optimizer = trained_state(unit)
        torch.save(weights, directory / "trainable.pt")
        if optimizer is None:
            _save_engine(unit, directory)
        else:
            torch.save(optimizer, directory / "optimizer.pt")
        torch.save(unit.lr_scheduler.state_dict(), directory / "scheduler.pt")
        if folder:
            (directory / "trainer_state.json").write_text(json.dumps({"global_step": unit.state.global_step}))
    (temporary / "state.json").write_text(json.dumps(state, indent=1), encoding="utf-8")
    shutil.rmtree(final, ignore_errors=True)
    temporary.rename(final)
    for old in sorted(root.glob("step-*"), key=lambda path: int(path.name.split("-")[1]))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def contribute_checkpoint(trainer: Any, directory: Path) -> None:
    """On a rank other than 0 while rank 0 saves into ``directory``: take part in gathering the state (FSDP, ZeRO-3)
    and write this rank's partition of a DeepSpeed engine's state."""
    _, optimizer = trained_state(trainer)
    if optimizer is None:
        _save_engine(trainer, directory)


def _save_engine(trainer: Any, directory: Path) -> None:
    """The DeepSpeed engine's own checkpoint (every rank writes its partition): the trained parameters' fp32
    master copy and the optimizer state."""
    trainer.model_wrapped.save_checkpoint(
        str(directory / "deepspeed"), tag=_ENGINE_TAG, save_latest=False, exclude_frozen_parameters=True
    )


def load_checkpoint(trainer: Any, path: Path) -> dict[str, Any]:
    """Restore weights, optimizer and scheduler from ``path``; return the saved loop state."""
    if not (path / "state.json").exists():
        raise FileNotFoundError(f"resume: {path} is not a checkpoint directory (no state.json)")
    state = json.loads((path / "state.json").read_text(encoding="utf-8"))
    for folder, unit in _units(trainer):
        directory = path / folder
        if not (directory / "trainable.pt").exists():
            raise ValueError(
                f"resume: checkpoint {path} has no {folder or 'trainable.pt'}; was it made with other "
                "policies (agl.train(policies=...))?"
            )
        trainable = torch.load(directory / "trainable.pt", map_location="cpu", weights_only=True)
        own = _trained(unit)
        if set(trainable) != set(own):
            odd = sorted(set(trainable) ^ set(own))
            raise ValueError(
                f"resume: checkpoint {directory} and this model differ in trained parameters (e.g. {odd[:3]}); was "
                "it made with a different model, LoRA setting or policies?"
            )
        engine_state = directory / "deepspeed"
        if unit.is_deepspeed_enabled:
            if not engine_state.exists():
                raise ValueError(
                    f"resume: checkpoint {directory} was made without DeepSpeed and has no DeepSpeed "
                    "engine state to resume this DeepSpeed run from"
                )
            unit.model_wrapped.load_checkpoint(
                str(engine_state), tag=_ENGINE_TAG, load_module_strict=False, load_lr_scheduler_states=False
            )
        elif engine_state.exists():
            raise ValueError(
                f"resume: checkpoint {directory} was made under DeepSpeed, whose optimizer state is partitioned in "
                "its own files: resume it under the same DeepSpeed config and number of processes (DeepSpeed's "
                "ds_to_universal converts it for another number)"
            )
        else:
            _load_weights_and_optimizer(unit, directory, trainable, own)
        unit.lr_scheduler.load_state_dict(torch.load(directory / "scheduler.pt", map_location="cpu", weights_only=True))
        steps = json.loads((directory / "trainer_state.json").read_text()) if folder else state
        unit.state.global_step = int(steps.get("global_step", state["step"]))
        if getattr(unit, "served_copy", None) is not None:
            unit.served_copy.refresh()
    logger.info("resumed from %s (step %s)", path, state["step"])
    return state


def _load_weights_and_optimizer(trainer: Any, directory: Path, trainable: dict[str, Any], own: dict[str, Any]) -> None:
    with torch.no_grad():
        for name, value in trainable.items():
            own[name].copy_(shard_like(value, own[name]))
    optimizer = torch.load(directory / "optimizer.pt", map_location="cpu", weights_only=True)
    params = [param for group in trainer.optimizer.param_groups for param in group["params"]]
    for index, values in optimizer["state"].items():  # under FSDP: each rank's shard of the whole state
        for key, value in values.items():
            if isinstance(value, torch.Tensor) and value.shape == params[index].shape:
                values[key] = shard_like(value, params[index])
    trainer.optimizer.load_state_dict(optimizer)


def trained_state(trainer: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None]:
    """The trained parameters by name and the optimizer's state, whole and on the CPU: gathered from the ranks'
    shards under FSDP or ZeRO-3 (then every rank must call this; all get them). Under DeepSpeed the optimizer
    state is the engine's (see :func:`_save_engine`): None here."""
    with torch.no_grad():  # the parameter itself, not a detached view: ZeRO-3 gathers it by its own attributes
        weights = {name: full_tensor(param).detach().cpu() for name, param in _trained(trainer).items()}
    if trainer.is_deepspeed_enabled:
        return weights, None
    optimizer = trainer.optimizer.state_dict()
    optimizer["state"] = {
        index: {
            key: full_tensor(value).cpu() if isinstance(value, torch.Tensor) else value for key, value in values.items()
        }
        for index, values in optimizer["state"].items()
    }
    return weights, optimizer


def _units(trainer: Any) -> list[tuple[str, Any]]:
    """(folder, trainer) for each trainer a checkpoint holds: a trainer, or each of a
    :class:`~agentlightning.trainers.learner._policy_set.PolicySet` (a set of one: the same layout as its trainer)."""
    policies = getattr(trainer, "trainers", None)
    if isinstance(policies, dict):
        return [("" if name is None else f"policies/{name}", unit) for name, unit in policies.items()]
    return [("", trainer)]


def _trained(trainer: Any) -> dict[str, Any]:
    """The parameters ``trainer``'s optimizer updates, by name (the LoRA adapter of its policy, or the model)."""
    if trainer.is_deepspeed_enabled:  # the engine's optimizer holds flat partitions, not the parameters
        return {name: param for name, param in trainer.model.named_parameters() if param.requires_grad}
    updated = {id(param) for group in trainer.optimizer.param_groups for param in group["params"]}
    return {name: param for name, param in trainer.model.named_parameters() if id(param) in updated}


def full_tensor(value: Any) -> Any:
    """``value`` whole on every rank: a sharded (``DTensor``) or ZeRO-3-partitioned parameter or state is gathered
    (every rank must call this for it, in the same order; a ZeRO-3 parameter itself, since a detached view loses
    what identifies its partition); anything else is returned as it is."""
    from torch.distributed.tensor import DTensor

    if isinstance(value, DTensor):
        return value.full_tensor()
    if hasattr(value, "ds_id"):  # a ZeRO-3 parameter (its .data is an empty placeholder between forwards)
        import deepspeed

        with deepspeed.zero.GatheredParameters([value]):
            return value.data.clone()
    return value


def shard_like(value: torch.Tensor, like: Any) -> Any:
    """The whole tensor ``value`` as this rank's shard of ``like``'s layout when ``like`` is sharded (no
    communication: every rank holds ``value``), else ``value`` on ``like``'s device."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(like, DTensor):
        return distribute_tensor(value.to(like.device), like.device_mesh, like.placements, src_data_rank=None)
    return value.to(like.device)
