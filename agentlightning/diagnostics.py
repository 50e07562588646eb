"""Plain-words explanations for rollouts that captured no LLM call or no reward.

"Empty transitions / reward is None" was the reference project's most common complaint: instead of training on
nothing, every rollout says what capture saw.
"""

from __future__ import annotations

from agentlightning.context import RolloutRecorder
from agentlightning.instrumentation import installed_adapters
from agentlightning.roles import role_matches, unmatched_patterns
from agentlightning.types import Rollout


def explain_rollout(rollout: Rollout, recorder: RolloutRecorder) -> list[str]:
    """Diagnostics for a finished rollout: empty capture, missing reward, role filters selecting nothing."""
    notes: list[str] = []
    llm_calls = rollout.llm_calls
    adapters = installed_adapters()
    if not llm_calls:
        endpoints = sorted(recorder.endpoints_seen)
        notes.append(
            "no LLM call was captured. "
            + (f"The agent called {', '.join(endpoints)}; " if endpoints else "No endpoint was called through a "
               "patched client; ")
            + (f"installed capture adapters: {', '.join(adapters)}. " if adapters else "no capture adapter is "
               "installed (is the openai package importable?). ")
            + "Make sure the agent sends its requests with the openai client (or a framework built on it) to "
            "llm.base_url, inside the rollout (threads started by the agent need contextvars.copy_context())."
        )
    roles_seen = sorted({call.role for call in llm_calls if call.role is not None})
    if llm_calls and rollout.trainable_roles is not None:
        selected = [call for call in llm_calls if role_matches(call.role, rollout.trainable_roles)]
        unnamed = sum(1 for call in llm_calls if call.role is None)
        if not selected:
            notes.append(
                f"roles={rollout.trainable_roles} selected none of the {len(llm_calls)} LLM calls; role names seen: "
                f"{roles_seen or 'none'}" + (f" ({unnamed} calls had no role)" if unnamed else "") + "."
            )
        else:
            missing = unmatched_patterns(rollout.trainable_roles, roles_seen)
            if missing:
                notes.append(f"roles {missing} never appeared in this rollout; role names seen: {roles_seen}.")
    if rollout.status == "succeeded" and rollout.final_reward is None:
        notes.append(
            "no final reward: the agent returned None and did not call agl.emit_reward(value, final=True); "
            "return a float, call agl.emit_reward(..., final=True), or pass @agl.rollout(reward=fn)."
        )
    return notes
