"""``agl.evaluate``: run an agent over a dataset against a model, greedy by default, and report its scores.

The model is an OpenAI-compatible URL (or an ``agl.LLM``), which needs nothing beyond the core, or something to
serve in-process: a training run's output directory, a ``save_pretrained`` directory (full weights or a LoRA
adapter), ``"smollm2"`` or a hub name. Only the in-process case loads torch: it is served by the Hugging Face
backend that ``agl.train`` uses (:mod:`agentlightning.trainers.served`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from agentlightning._decorator import RolloutAgent
from agentlightning._run import run
from agentlightning.evaluation._report import EvalReport
from agentlightning.types import LLM, Rollout

logger = logging.getLogger(__name__)

EVAL_DIR = "eval"
"""Reports of a run's model go to ``<run directory>/eval/<name>.json``."""


def evaluate(
    agent: Any,
    dataset: Sequence[Any],
    model: Any,
    *,
    name: str = "eval",
    model_name: str | None = None,
    tokenizer: Any = None,
    api_key: str = "EMPTY",
    temperature: float = 0.0,
    max_tokens: int | None = None,
    repeats: int = 1,
    n_workers: int = 4,
    timeout: float | None = 600.0,
    success_threshold: float = 1.0,
    accuracy: Callable[[Rollout], bool] | None = None,
    output: str | Path | None = None,
    max_batch_size: int = 64,
) -> EvalReport:
    """Run ``agent`` on every task of ``dataset`` (``repeats`` times each) against ``model`` and return its
    :class:`EvalReport` (accuracy with a Wilson 95% interval, mean reward with a bootstrap one, calls per role, tool
    errors, tokens, failures; the rollouts in ``report.rollout_records``).

    - ``model``: an OpenAI-compatible base URL (``http://host:8000/v1``; ``model_name`` is the model to request,
      default: the first the endpoint lists) or an ``agl.LLM``; else served in-process: a run directory of
      ``agl.train`` (its final ``model/``), a ``save_pretrained`` directory or LoRA adapter, ``"smollm2"``, a hub
      name, or a loaded model with ``tokenizer``;
    - ``temperature`` (0: greedy) and ``max_tokens`` are passed to the agent as ``llm.sampling_parameters`` (and,
      in-process, enforced by the backend);
    - ``output``: where the JSON report goes; for a run directory it defaults to ``<run>/eval/<name>.json``.
    """
    if isinstance(dataset, (str, bytes, dict)) or not isinstance(dataset, Sequence) or not dataset:
        raise ValueError(f"agl.evaluate(dataset=...) must be a non-empty list of tasks, got {type(dataset).__name__}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"agl.evaluate(repeats={repeats!r}): must be a positive integer")
    if not isinstance(agent, RolloutAgent):
        agent = RolloutAgent(agent)
    sampling: dict[str, Any] = {"temperature": temperature}
    if max_tokens is not None:
        sampling["max_tokens"] = max_tokens
    tasks = [task for task in dataset for _ in range(repeats)]
    with _endpoint(model, model_name, api_key, tokenizer, sampling, max_batch_size) as llm:
        llm = llm.model_copy(update={"sampling_parameters": {**llm.sampling_parameters, **sampling}})
        logger.info("agl.evaluate: %d rollouts of %r against %s (%s)", len(tasks), agent.name, llm.base_url, llm.model)
        started = time.perf_counter()
        rollouts = run(agent, tasks, llm=llm, n_workers=n_workers, timeout=timeout)
        seconds = time.perf_counter() - started
    report = EvalReport.from_rollouts(
        rollouts,
        name=name,
        model=str(model) if not hasattr(model, "config") else type(model).__name__,
        success_threshold=success_threshold,
        judge=accuracy,
        agent=agent.name,
        temperature=temperature,
        seconds=seconds,
        model_version=llm.model_version,
    )
    path = output if output is not None else default_report_path(model, name)
    if path is not None:
        report.save(path)
        logger.info("agl.evaluate: report written to %s", path)
    return report


def default_report_path(model: Any, name: str) -> Path | None:
    """``<run>/eval/<name>.json`` when ``model`` is a training run's directory, else None."""
    if isinstance(model, (str, Path)) and is_run_dir(Path(model)):
        return Path(model) / EVAL_DIR / f"{name}.json"
    return None


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` is the output directory of a training run (its metrics or its final model)."""
    return path.is_dir() and ((path / "metrics.jsonl").is_file() or (path / "model").is_dir())


@contextlib.contextmanager
def _endpoint(
    model: Any, model_name: str | None, api_key: str, tokenizer: Any, sampling: dict[str, Any], max_batch_size: int
) -> Iterator[LLM]:
    if isinstance(model, LLM):
        yield model
        return
    if isinstance(model, str) and model.startswith(("http://", "https://")):
        yield LLM(base_url=model, model=model_name or _first_model(model, api_key), api_key=api_key)
        return
    try:
        from agentlightning.trainers.served import serve_in_process
    except ImportError as exc:
        raise RuntimeError(
            f"agl.evaluate(model={model!r}) serves the model in-process, which needs the training extra: "
            f"pip install 'agentlightning[train]' ({exc}); or pass the URL of a running server"
        ) from None
    with serve_in_process(model, tokenizer=tokenizer, sampling=sampling, max_batch_size=max_batch_size) as llm:
        yield llm


def _first_model(base_url: str, api_key: str) -> str:
    """The first model an OpenAI-compatible endpoint lists (``GET /models``)."""
    from openai import OpenAI

    with OpenAI(base_url=base_url, api_key=api_key, max_retries=1, timeout=30) as client:
        models = [entry.id for entry in client.models.list()]
    if not models:
        raise ValueError(f"agl.evaluate: {base_url} lists no models; pass model_name=")
    return models[0]
