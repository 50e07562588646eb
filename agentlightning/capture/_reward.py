"""``agl.emit_reward``: rewards from inside a running agent."""

from __future__ import annotations

import logging

from agentlightning.capture._context import current_recorder
from agentlightning.types import Reward, check_finite

logger = logging.getLogger(__name__)


def emit_reward(value: float, final: bool = False, name: str | None = None) -> Reward | None:
    """Record a reward in the current rollout: ``final=True`` sets the episode return R (used when the agent returns
    None); otherwise it attaches to the latest finished LLM call (or to the episode before any). Outside a rollout
    it is dropped with a warning (None is returned); a value that is not a finite number raises ``ValueError``."""
    number = check_finite(value, f"agl.emit_reward(name={name!r})")
    recorder = current_recorder()
    if recorder is None:
        logger.warning("agl.emit_reward(%r) called outside a rollout; the reward is dropped", value)
        return None
    call_id = None if final else next((call.call_id for call in reversed(recorder.calls) if call.kind == "llm"), None)
    reward = Reward(value=number, call_id=call_id, source="final" if final else "emitted", name=name)
    recorder.rewards.append(reward)
    return reward
