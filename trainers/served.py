"""A model served in-process for evaluation, the way ``agl.train`` serves its policy (the Hugging Face backend of
:func:`~agentlightning.trainers.loop.make_backend`), behind an OpenAI-compatible URL on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agentlightning.trainers.config import TrainConfig
from agentlightning.trainers.loop import make_backend
from agentlightning.trainers.models import load_model, prepare_tokenizer

from agentlightning.types import LLM

logger = logging.getLogger(__name__)


def resolve_model_path(model: str | Path) -> tuple[str, str]:
    """``(what load_model gets, model version)`` for a model given by name or path: a training run's directory
    means its final ``model/`` (at the run's last version), any other string is passed on as it is."""
    path = Path(model).expanduser()
    if path.is_dir() and (path / "model").is_dir() and not (path / "config.json").exists():
        return str(path / "model"), _last_version(path) or "final"
    if path.is_dir() and (path / "checkpoints").is_dir() and not (path / "model").is_dir():
        raise FileNotFoundError(
            f"{path} is a training run without its final model/ (save_model=False, or still running); its "
            "checkpoints hold only the trained tensors: evaluate once the run has saved model/"
        )
    return str(model), "base" if not path.exists() else path.name


@contextlib.contextmanager
def serve_in_process(
    model: Any, *, tokenizer: Any = None, sampling: dict[str, Any] | None = None, max_batch_size: int = 64
) -> Iterator[LLM]:
    """Serve ``model`` (see :func:`resolve_model_path`, or a loaded model with ``tokenizer``) and yield the
    ``agl.LLM`` of its endpoint; ``sampling`` (e.g. ``{"temperature": 0}``) is enforced on every request."""
    if isinstance(model, (str, Path)):
        source, version = resolve_model_path(model)
        logger.info("serving %s in-process (version %s)", source, version)
        policy, tokenizer = load_model(source)
        name = Path(source).name if Path(source).exists() else source.split("/")[-1]
    else:
        if tokenizer is None:
            raise ValueError("agl.evaluate(model=<a loaded model>) also needs tokenizer=")
        policy, version = model, "given"
        prepare_tokenizer(tokenizer)
        name = str(getattr(policy.config, "_name_or_path", "") or "policy").split("/")[-1] or "policy"
    policy.eval()
    config = TrainConfig(backend="hf", max_batch_size=max_batch_size)
    backend = make_backend(config, policy, tokenizer, name, version, None).start()
    backend.sampling_overrides = dict(sampling or {})
    try:
        yield LLM(base_url=backend.base_url, model=backend.model_name, model_version=backend.model_version)
    finally:
        backend.stop()


def _last_version(run_dir: Path) -> str | None:
    """The model version after the last step in a run's ``metrics.jsonl``."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return None
    version = None
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            version = row.get("model_version_after") or row.get("model_version") or version
    return version
