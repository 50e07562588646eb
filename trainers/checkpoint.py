"""Checkpoints of a training run: trainable weights, optimizer, scheduler, loop state; resume from the latest.

Layout: ``<output_dir>/checkpoints/step-<N>/`` with ``trainable.pt`` (the parameters that train: the LoRA adapter
or the whole model), ``optimizer.pt``, ``scheduler.pt`` and ``state.json`` (step, model version, task sampler,
RNG state). A checkpoint directory appears only once complete (written under a temporary name, then renamed).
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
    trainable = {name: param.detach().cpu() for name, param in trainer.model.named_parameters() if param.requires_grad}
    torch.save(trainable, temporary / "trainable.pt")
    torch.save(trainer.optimizer.state_dict(), temporary / "optimizer.pt")
    torch.save(trainer.lr_scheduler.state_dict(), temporary / "scheduler.pt")
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
    trainable = torch.load(path / "trainable.pt", map_location="cpu", weights_only=True)
    own = dict(trainer.model.named_parameters())
    unknown = sorted(set(trainable) - set(own))
    if unknown:
        raise ValueError(
            f"resume: checkpoint {path} has parameters this model lacks (e.g. {unknown[:3]}); was it made with a "
            "different model or LoRA setting?"
        )
    with torch.no_grad():
        for name, value in trainable.items():
            own[name].copy_(value.to(own[name].device))
    trainer.optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True))
    trainer.lr_scheduler.load_state_dict(torch.load(path / "scheduler.pt", map_location="cpu", weights_only=True))
    state = json.loads((path / "state.json").read_text(encoding="utf-8"))
    trainer.state.global_step = int(state.get("global_step", state["step"]))
    logger.info("resumed from %s (step %s)", path, state["step"])
    return state
