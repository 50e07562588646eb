"""Naming an agent so that spawned worker processes can import it: ``"package.module:attribute"``, defined at module
level of an importable module (or of the script run as ``__main__``, guarded by ``if __name__ == "__main__":``)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

from agentlightning._decorator import RolloutAgent


def agent_ref(agent: RolloutAgent | Callable[..., Any] | str) -> str:
    """The import reference of ``agent`` (checked to resolve back to it)."""
    if isinstance(agent, str):
        load_agent(agent)
        return agent
    func = agent.func if isinstance(agent, RolloutAgent) else agent
    module, qualname = getattr(func, "__module__", None), getattr(func, "__qualname__", "")
    if not module or "<locals>" in qualname or "<lambda>" in qualname:
        raise ValueError(f"agent {qualname or agent!r} cannot be imported by worker processes: define it at module "
                         "level (not inside a function or as a lambda), or pass 'module:attribute'")
    named = None
    if isinstance(agent, RolloutAgent):  # ``my_agent = agl.rollout(run, roles=[...])``: its options travel by name
        named = next((name for name, value in vars(_resolve(module, "")).items() if value is agent), None)
    ref = f"{module}:{named or qualname}"
    loaded = load_agent(ref)
    if loaded.func is not func:
        raise ValueError(f"agent reference {ref!r} resolves to a different object than the agent given")
    if isinstance(agent, RolloutAgent) and loaded is not agent and (agent.roles is not None or agent.reward):
        raise ValueError(
            f"agent {agent.name!r} (with roles/reward options) is not a module-level name of {module}, so worker "
            "processes could not rebuild it: assign it at module level (my_agent = agl.rollout(...)) and pass that"
        )
    return ref


def load_agent(ref: str) -> RolloutAgent:
    """Import the agent named by ``ref``; a plain function is wrapped as if decorated with bare ``@agl.rollout``."""
    module, sep, qualname = ref.partition(":")
    if not sep or not module or not qualname:
        raise ValueError(f"agent reference must look like 'package.module:attribute', got {ref!r}")
    target = _resolve(module, qualname)
    if isinstance(target, RolloutAgent):
        return target
    if callable(target):
        return RolloutAgent(target)
    raise TypeError(f"agent reference {ref!r} names a {type(target).__name__}, not an agent function")


def _resolve(module_name: str, qualname: str) -> Any:
    if module_name in ("__main__", "__mp_main__"):  # a spawned worker runs the parent's script as __mp_main__
        target: Any = sys.modules.get("__mp_main__") or sys.modules["__main__"]
    else:
        try:
            target = importlib.import_module(module_name)
        except ImportError as exc:
            raise ValueError(f"cannot import module {module_name!r} of the agent: {exc} (sys.path={sys.path[:4]}...)"
                             ) from None
    for part in filter(None, qualname.split(".")):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ValueError(f"agent {module_name}:{qualname}: {module_name} has no attribute {qualname!r}") from None
    return target
