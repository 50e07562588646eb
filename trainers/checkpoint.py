"""Checkpoints of a training run: trainable weights, optimizer, scheduler, loop state; resume from the latest.

Layout: ``<output_dir>/checkpoints/step-<N>/`` with ``trainable.pt`` (the parameters that train: the LoRA adapter
or the whole model), ``optimizer.pt``, ``scheduler.pt`` and ``state.json`` (step, model version, task sampler,
RNG state). With several policies (:class:`~agentlightning.trainers._policy_set.PolicySet`), each policy's adapter,
optimizer and scheduler are in ``policies/<name>/`` with its own ``trainer_state.json`` (its update count). A
checkpoint directory appears only once complete (written under a temporary name, then renamed). Under FSDP the
weights and optimizer state are gathered whole (:func:`trained_state`, on every rank) and saved in the same layout,
so a checkpoint resumes with or without sharding.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)


def checkpoint_root(output_dir: Path) -> Path:
    return output_dir / "checkpoints"


def latest_checkpoint(output_dir: Path) -> Path | None:
    """The newest complete checkpoint under ``output_dir``, or None."""
    root = checkpoint_root(output_dir)
    if not root.exists():
        return None
    found = [path for path in root.glob("step-*") if (path / "state.json").exists()]
    return max(found, key=lambda path: int(path.name.split("-")[1]), default=None)


def save_checkpoint(trainer: Any, output_dir: Path, state: dict[str, Any], keep: int = 2) -> Path:
    """Write a checkpoint for ``state['step']`` and keep only the newest ``keep``."""
    root = checkpoint_root(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{state['step']}"
    temporary = root / f".step-{state['step']}.tmp{os.getpid()}"
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir()
    for folder, unit in _units(trainer):
        directory = temporary / folder
        directory.mkdir(parents=True, exist_ok=True)
        weights, optimizer = trained_state(unit)
        torch.save(weights, directory / "trainable.pt")
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


def load_checkpoint(trainer: Any, path: Path) -> dict[str, Any]:
    """Restore weights, optimizer and scheduler from ``path``; return the saved loop state."""
    if not (path / "state.json").exists():
        raise FileNotFoundError(f"resume: {path} is not a checkpoint directory (no state.json)")
    state = json.loads((path / "state.json").read_text(encoding="utf-8"))
    for folder, unit in _units(trainer):
        directory = path / folder
        if not (directory / "trainable.pt").exists():
            raise ValueError(f"resume: checkpoint {path} has no {folder or 'trainable.pt'}; was it made with other "
                             "policies (agl.train(policies=...))?")
        trainable = torch.load(directory / "trainable.pt", map_location="cpu", weights_only=True)
        own = _trained(unit)
        if set(trainable) != set(own):
            odd = sorted(set(trainable) ^ set(own))
            raise ValueError(
                f"resume: checkpoint {directory} and this model differ in trained parameters (e.g. {odd[:3]}); was "
                "it made with a different model, LoRA setting or policies?"
            )
        with torch.no_grad():
            for name, value in trainable.items():
                own[name].copy_(shard_like(value, own[name]))
        optimizer = torch.load(directory / "optimizer.pt", map_location="cpu", weights_only=True)
        params = [param for group in unit.optimizer.param_groups for param in group["params"]]
        for index, values in optimizer["state"].items():  # under FSDP: each rank's shard of the whole state
            for key, value in values.items():
                if isinstance(value, torch.Tensor) and value.shape == params[index].shape:
                    values[key] = shard_like(value, params[index])
        unit.optimizer.load_state_dict(optimizer)
        unit.lr_scheduler.load_state_dict(torch.load(directory / "scheduler.pt", map_location="cpu", weights_only=True))
        steps = json.loads((directory / "trainer_state.json").read_text()) if folder else state
        unit.state.global_step = int(steps.get("global_step", state["step"]))
        if getattr(unit, "served_copy", None) is not None:
            unit.served_copy.refresh()
    logger.info("resumed from %s (step %s)", path, state["step"])
    return state


def trained_state(trainer: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The trained parameters by name and the optimizer's state, whole and on the CPU: gathered from the ranks'
    shards under FSDP (then every rank must call this; all get them)."""
    weights = {name: full_tensor(param.detach()).cpu() for name, param in _trained(trainer).items()}
    optimizer = trainer.optimizer.state_dict()
    optimizer["state"] = {index: {key: full_tensor(value).cpu() if isinstance(value, torch.Tensor) else value
                                  for key, value in values.items()} for index, values in optimizer["state"].items()}
    return weights, optimizer


def _units(trainer: Any) -> list[tuple[str, Any]]:
    """(folder, trainer) for each trainer a checkpoint holds: the one, or one per policy."""
    policies = getattr(trainer, "trainers", None)
    if isinstance(policies, dict):
        return [(f"policies/{name}", unit) for name, unit in policies.items()]
    return [("", trainer)]


def _trained(trainer: Any) -> dict[str, Any]:
    """The parameters ``trainer``'s optimizer updates, by name (the LoRA adapter of its policy, or the model)."""
    updated = {id(param) for group in trainer.optimizer.param_groups for param in group["params"]}
    return {name: param for name, param in trainer.model.named_parameters() if id(param) in updated}


def full_tensor(value: Any) -> Any:
    """``value`` whole on every rank: a sharded (``DTensor``) parameter or state is gathered (every rank must call
    this for it, in the same order); anything else is returned as it is."""
    from torch.distributed.tensor import DTensor

    return value.full_tensor() if isinstance(value, DTensor) else value


def shard_like(value: torch.Tensor, like: Any) -> Any:
    """The whole tensor ``value`` as this rank's shard of ``like``'s layout when ``like`` is sharded (no
    communication: every rank holds ``value``), else ``value`` on ``like``'s device."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(like, DTensor):
        return distribute_tensor(value.to(like.device), like.device_mesh, like.placements, src_data_rank=None)
    return value.to(like.device)
