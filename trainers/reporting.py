"""What a user watches during training: per-step metrics as JSONL (+ TensorBoard / W&B / MLflow / Trackio on
request) and a reward-curve PNG."""

from __future__ import annotations

import importlib.util
import json
import logging
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentlightning.trainers.config import REPORTERS

from agentlightning.types import MISSED_BY_CAPTURE, Rollout, Transition

logger = logging.getLogger(__name__)


def check_reporters(report_to: Sequence[str]) -> None:
    """Refuse ``report_to`` names whose package is not installed: called as a run is configured, before its model
    loads, so that a missing reporter fails in a second rather than when the first step is reported."""
    missing = [name for name in report_to if importlib.util.find_spec(name) is None]
    if missing:
        raise ValueError(
            f"report_to={list(report_to)!r}: {missing} not installed; pip install {' '.join(missing)}, "
            "or leave them out of report_to"
        )


class MetricsWriter:
    """Appends one JSON object per step to ``metrics.jsonl`` and forwards scalars to the requested reporters
    (``report_to``: any of :data:`~agentlightning.trainers.config.REPORTERS`)."""

    def __init__(self, output_dir: Path, report_to: Sequence[str] = (), run_name: str | None = None) -> None:
        unknown = [name for name in report_to if name not in REPORTERS]
        if unknown:
            raise ValueError(f"report_to={list(report_to)!r}: unknown reporter(s) {unknown}; use any of {REPORTERS}")
        self.path = output_dir / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tensorboard: Any = None
        self._wandb: Any = None
        self._mlflow: Any = None
        self._trackio: Any = None
        if "tensorboard" in report_to:
            _require("tensorboard")
            from torch.utils.tensorboard import SummaryWriter

            self._tensorboard = SummaryWriter(log_dir=str(output_dir / "tensorboard"))
        if "wandb" in report_to:
            self._wandb = _require("wandb").init(
                project="agentlightning", name=run_name, dir=str(output_dir), resume="allow"
            )
        if "mlflow" in report_to:
            self._mlflow = _require("mlflow")
            self._mlflow.start_run(run_name=run_name)
        if "trackio" in report_to:
            self._trackio = _require("trackio")
            self._trackio.init(project="agentlightning", name=run_name)

    def write(self, row: dict[str, Any]) -> None:
        """Record the metrics of one step (``row['step']`` is the x axis)."""
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(row, default=_plain) + "\n")
        scalars = {key: float(value) for key, value in row.items() if _is_number(value) and key != "step"}
        step = int(row["step"])
        if self._tensorboard is not None:
            for key, value in scalars.items():
                self._tensorboard.add_scalar(key, value, step)
            self._tensorboard.flush()
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)
        if self._mlflow is not None:
            self._mlflow.log_metrics(scalars, step=step)
        if self._trackio is not None:
            self._trackio.log(scalars, step=step)

    def close(self) -> None:
        if self._tensorboard is not None:
            self._tensorboard.close()
        if self._wandb is not None:
            self._wandb.finish()
        if self._mlflow is not None:
            self._mlflow.end_run()
        if self._trackio is not None:
            self._trackio.finish()


def _require(package: str) -> Any:
    import importlib

    try:
        return importlib.import_module(package)
    except ImportError as exc:
        raise ImportError(f"report_to=[{package!r}] needs the {package} package: pip install {package}") from exc


def rollout_metrics(
    rollouts: Sequence[Rollout], version: str | dict[str | None, str], judge: Callable[[Rollout], bool]
) -> dict[str, float]:
    """Reward, accuracy (``judge`` says which rollouts succeeded) and call statistics of ``rollouts``;
    ``calls_on_version`` counts the calls served by ``version`` (per policy: ``{policy: version}``)."""
    rewards = [rollout.final_reward if rollout.final_reward is not None else 0.0 for rollout in rollouts]
    calls = [call for rollout in rollouts for call in rollout.llm_calls]
    completion_tokens = [len(call.completion_token_ids or []) for call in calls]

    def on_version(call: Any) -> bool:
        wanted = version.get(call.metadata.get("policy")) if isinstance(version, dict) else version
        return call.metadata.get("model_version") == wanted

    return {
        "reward": statistics.fmean(rewards) if rewards else 0.0,
        "reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        "accuracy": statistics.fmean(1.0 if judge(r) else 0.0 for r in rollouts) if rollouts else 0.0,
        "failed": float(sum(1 for r in rollouts if r.status != "succeeded")),
        "rollouts": float(len(rollouts)),
        "llm_calls": float(len(calls)),
        "completion_tokens_mean": statistics.fmean(completion_tokens) if completion_tokens else 0.0,
        "calls_on_version": float(sum(1 for call in calls if on_version(call))),
        "calls/proxy_only": float(sum(1 for call in calls if call.metadata.get(MISSED_BY_CAPTURE))),
    }


UNNAMED_ROLE = "unnamed"
"""The name of the role of LLM calls that have none, in the ``role/<name>/...`` metrics."""


def role_metrics(rollouts: Sequence[Rollout], transitions: Sequence[Transition]) -> dict[str, float]:
    """Per role that spoke in ``rollouts`` or was trained (``role/<name>/...``): its LLM calls, the transitions
    trained from them, their mean completion length and the mean final reward of the rollouts it spoke in."""
    calls: dict[str, list[int]] = {}
    rewards: dict[str, list[float]] = {}
    for rollout in rollouts:
        spoke = set()
        for call in rollout.llm_calls:
            role = call.role or UNNAMED_ROLE
            calls.setdefault(role, []).append(len(call.completion_token_ids or []))
            spoke.add(role)
        for role in spoke:
            rewards.setdefault(role, []).append(rollout.final_reward if rollout.final_reward is not None else 0.0)
    trained: dict[str, int] = {}
    for row in transitions:
        trained[row.role or UNNAMED_ROLE] = trained.get(row.role or UNNAMED_ROLE, 0) + 1
    metrics: dict[str, float] = {}
    for role in sorted(set(calls) | set(trained)):
        lengths = calls.get(role, [])
        metrics[f"role/{role}/llm_calls"] = float(len(lengths))
        metrics[f"role/{role}/transitions"] = float(trained.get(role, 0))
        if lengths:
            metrics[f"role/{role}/completion_tokens_mean"] = statistics.fmean(lengths)
            metrics[f"role/{role}/reward"] = statistics.fmean(rewards[role])
    return metrics


STEP_WARNING = "agl_step"
"""The ``extra=`` key of a warning logged for one training step: it is in that step's ``metrics.jsonl`` row."""


class WarningLog(logging.Handler):
    """Appends the run's warnings (WARNING and above, of every logger that reaches the root) to ``warnings.jsonl``
    beside ``metrics.jsonl``, for the dashboard; those of one step (logged with ``extra={STEP_WARNING: step}``)
    are left out: the step's row holds them."""

    def __init__(self, output_dir: Path) -> None:
        super().__init__(logging.WARNING)
        self.path = output_dir / "warnings.jsonl"

    def emit(self, record: logging.LogRecord) -> None:
        if hasattr(record, STEP_WARNING):
            return
        try:
            entry = {"time": record.created, "level": record.levelname, "logger": record.name}
            with self.path.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps({**entry, "message": record.getMessage()}) + "\n")
        except Exception:  # a full disk must not stop training
            self.handleError(record)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl`` file (empty when it does not exist)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def plot_curve(rows: Sequence[dict[str, Any]], path: Path, title: str = "Agent Lightning training") -> Path | None:
    """Write a PNG of training reward (and validation reward / accuracy when present) against the step."""
    train = [(row["step"], row["reward"]) for row in rows if _is_number(row.get("reward"))]
    val_reward = [(row["step"], row["val/reward"]) for row in rows if _is_number(row.get("val/reward"))]
    val_acc = [(row["step"], row["val/accuracy"]) for row in rows if _is_number(row.get("val/accuracy"))]
    if not (train or val_reward):
        logger.warning("no reward values to plot; %s not written", path)
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4), dpi=110)
    if train:
        axis.plot(*zip(*train, strict=True), marker=".", alpha=0.6, label="train reward (mean of step)")
    if val_reward:
        axis.plot(*zip(*val_reward, strict=True), marker="o", linewidth=2, label="held-out reward")
    if val_acc:
        axis.plot(*zip(*val_acc, strict=True), marker="s", linewidth=2, label="held-out accuracy")
    axis.set_xlabel("training step")
    axis.set_ylabel("reward / accuracy")
    axis.set_title(title)
    axis.grid(alpha=0.3)
    axis.legend(loc="best")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
    return path


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def _plain(value: Any) -> Any:
    return str(value)
