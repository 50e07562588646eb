"""The output directory of a training run: a fresh one per run, never two runs in one store.

``output_dir=None`` (the default) is a new ``runs/agl-train-<date>-<time>``; with ``resume=True`` it is the newest
of those that holds a checkpoint. A directory given by name that already holds a run (its store, metrics or
checkpoints) is refused unless the run is resumed (``resume``) or replaced (``overwrite``: its files are deleted,
nothing else in the directory is).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sqlite3
import time
from pathlib import Path

from agentlightning.trainers.config import TrainConfig

logger = logging.getLogger(__name__)

RUNS_ROOT = Path("runs")
PREFIX = "agl-train-"

RUN_FILES = ("metrics.jsonl", "reward_curve.png")
"""Files a run writes into its directory besides its store (a run is there when any of these or
:data:`RUN_FOLDERS` is, or the store holds rollouts)."""
RUN_FOLDERS = ("checkpoints", "model", "trl", "tensorboard", "vllm-base")
STORE = "store.db"


def run_directory(config: TrainConfig) -> Path:
    """The directory this run writes to (see the module docstring); raises ``ValueError`` for one that holds
    another run. Only the main process (rank 0) deletes anything."""
    if config.output_dir is None:
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise ValueError("agl.train under `accelerate launch` needs output_dir= (every rank must write to one)")
        if config.resume is True:
            found = newest_run()
            if found is not None:
                logger.info("resume=True: continuing the newest run, %s", found)
                return found
        return fresh_run_directory()
    path = Path(config.output_dir)
    if config.resume or not holds_a_run(path):
        return path
    if not config.overwrite:
        raise ValueError(
            f"output_dir {str(path)!r} already holds a training run ({', '.join(run_contents(path))}); "
            "continue it with resume=True (--resume), replace it with overwrite=True (--overwrite), or choose "
            "another output_dir (the default is a fresh runs/agl-train-<date>-<time>)"
        )
    if int(os.environ.get("RANK", "0")) == 0:
        logger.warning("overwrite=True: deleting the run in %s (%s)", path, ", ".join(run_contents(path)))
        for name in run_contents(path):
            target = path / name
            shutil.rmtree(target) if target.is_dir() else target.unlink()
    return path


def holds_a_run(path: Path) -> bool:
    """Whether ``path`` holds files of a training run."""
    return bool(run_contents(path))


def run_contents(path: Path) -> list[str]:
    """The names of the run's files and folders in ``path`` (its store only once it holds rollouts: ``agl server
    --model --store`` may have created it empty there for this run)."""
    found = [name for name in (*RUN_FILES, *RUN_FOLDERS) if (path / name).exists()]
    if _has_rollouts(path / STORE):
        found += [name for name in (STORE, f"{STORE}-wal", f"{STORE}-shm") if (path / name).exists()]
    return found


def _has_rollouts(store: Path) -> bool:
    if not store.exists():
        return False
    try:
        with contextlib.closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True)) as db:
            return db.execute("SELECT 1 FROM rollouts LIMIT 1").fetchone() is not None  # the store's table
    except sqlite3.Error:  # not a store, or one from elsewhere: not ours to reuse
        return True


def fresh_run_directory(root: Path = RUNS_ROOT) -> Path:
    """A new ``<root>/agl-train-<date>-<time>`` (with ``-2``, ``-3``, ... when one started in the same second)."""
    stem = root / (PREFIX + time.strftime("%Y%m%d-%H%M%S"))
    path, number = stem, 1
    while path.exists():
        number += 1
        path = stem.with_name(f"{stem.name}-{number}")
    return path


def newest_run(root: Path = RUNS_ROOT) -> Path | None:
    """The most recently written ``<root>/agl-train-*`` that has a checkpoint, or None."""
    if not root.is_dir():
        return None
    runs = [path for path in root.glob(PREFIX + "*") if (path / "checkpoints").is_dir()]
    return max(runs, key=lambda path: path.stat().st_mtime, default=None)
