"""Evaluate an agent against a model: ``agl.evaluate`` and its :class:`EvalReport` (scores with 95% intervals),
``compare`` for the difference of two reports (see ``docs/evaluation.md``)."""

from agentlightning.evaluation._evaluate import default_report_path, evaluate, is_run_dir
from agentlightning.evaluation._intervals import Interval, wilson_interval
from agentlightning.evaluation._report import Comparison, EvalReport, TaskResult, compare

__all__ = [
    "Comparison",
    "EvalReport",
    "Interval",
    "TaskResult",
    "compare",
    "default_report_path",
    "evaluate",
    "is_run_dir",
    "wilson_interval",
]
