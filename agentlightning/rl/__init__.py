"""LightningRL: rollouts -> transitions (credit assignment, AIR) -> advantages -> padded batches.

Everything here is pure Python; :func:`pack`, which needs torch and numpy (the ``[train]`` extra), lives with the
trainer (``agentlightning.trainers.learner.batch``) and is loaded from there on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from agentlightning.rl.advantages import ESTIMATORS, WEIGHTINGS, compute_advantages
from agentlightning.rl.air import AIR, AirRule, CallRule, FormatRule, LLMErrorRule, ToolErrorRule
from agentlightning.rl.credit import CREDIT_FUNCTIONS, CreditFunction, discounted, identical, last
from agentlightning.rl.transitions import Extraction, ExtractionStats, extract_transitions, transitions

if TYPE_CHECKING:
    from agentlightning.trainers.learner.batch import PackedBatch, PackStats, pack

__all__ = [
    "AIR",
    "CREDIT_FUNCTIONS",
    "ESTIMATORS",
    "WEIGHTINGS",
    "AirRule",
    "CallRule",
    "CreditFunction",
    "Extraction",
    "ExtractionStats",
    "FormatRule",
    "LLMErrorRule",
    "PackStats",
    "PackedBatch",
    "ToolErrorRule",
    "compute_advantages",
    "discounted",
    "extract_transitions",
    "identical",
    "last",
    "pack",
    "transitions",
]


def __getattr__(name: str) -> Any:
    if name not in ("PackedBatch", "PackStats", "pack"):
        raise AttributeError(f"module 'agentlightning.rl' has no attribute {name!r}")
    return getattr(importlib.import_module("agentlightning.trainers.learner.batch"), name)
