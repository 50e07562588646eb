"""Agent Lightning: train the LLM inside any existing agent with reinforcement learning.

Public names are loaded on first use, so ``import agentlightning`` stays light (no torch, no framework).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    name: module
    for module, names in {
        "agentlightning.types": ("Call", "Reward", "Rollout", "Transition", "LLM", "ErrorInfo"),
        "agentlightning._decorator": ("rollout", "RolloutAgent"),
        "agentlightning._command": ("CommandAgent", "CommandResult"),
        "agentlightning.capture": ("role", "emit_reward", "instrument", "uninstrument"),
        "agentlightning._run": ("run", "arun"),
        "agentlightning.rl.transitions": ("transitions",),
        "agentlightning.trainers": ("train",),
        "agentlightning.trainers.config": ("TrainConfig", "TrainResult"),
        "agentlightning.errors": ("AgentLightningError", "CommandError", "NothingTrainedError"),
        "agentlightning.evaluation": ("evaluate", "EvalReport"),
        "agentlightning.trainers.policies": ("Policy",),
        "agentlightning.client": ("Client", "RayWorkers"),
    }.items()
    for name in names
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from agentlightning._command import CommandAgent, CommandResult
    from agentlightning._decorator import RolloutAgent, rollout
    from agentlightning.capture import emit_reward, instrument, role, uninstrument
    from agentlightning.errors import AgentLightningError, CommandError, NothingTrainedError
    from agentlightning.evaluation import EvalReport, evaluate
    from agentlightning.trainers import train
    from agentlightning.trainers.config import TrainConfig, TrainResult
    from agentlightning.types import LLM, Call, ErrorInfo, Reward, Rollout, Transition


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agentlightning' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
