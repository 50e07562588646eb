"""``agl.emit_reward``: rewards from inside a running agent."""

from __future__ import annotations

import logging

from agentlightning.capture._context import current_recorder
from agentlightning.types import Reward, check_finite

logger = logging.getLogger(__name__)


def emit_reward(value: float, final: bool = False, name: str | None = None) -> Reward | None:
    """Record a reward in the current rollout.

    An intermediate reward (``final=False``) attaches to the latest finished LLM call of the rollout (or to the
    episode when there is none yet). ``final=True`` sets the episode return R, used when the agent returns None.
    Outside a rollout the reward is dropped with a warning and None is returned.
    A value that is not a finite number raises ``ValueError`` naming it.
    """
    number = check_finite(value, f"agl.emit_reward(name={name!r})")
    recorder = current_recorder()
    if recorder is None:
        logger.warning("agl.emit_reward(%r) called outside a rollout; the reward is dropped", value)
        return None
    if final:
        reward = Reward(value=number, call_id=None, source="final", name=name)
    else:
        reward = Reward(value=number, call_id=recorder.last_llm_call_id(), source="emitted", name=name)
    recorder.add_reward(reward)
    return reward
