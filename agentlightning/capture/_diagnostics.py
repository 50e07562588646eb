"""Plain-words explanations for rollouts that captured no LLM call, no usable call, or no reward: what capture saw
(endpoints compared with ``llm.base_url``, the openai patch, calls outside the rollout's context, roles)."""

from __future__ import annotations

import logging
import sys

from agentlightning.capture._context import RolloutRecorder, stray_calls_since
from agentlightning.capture._instrument import installed_adapters
from agentlightning.types import Rollout, role_matches, unmatched_patterns

logger = logging.getLogger(__name__)


def explain_rollout(rollout: Rollout, recorder: RolloutRecorder, llm_base_url: str) -> list[str]:
    """Diagnostics for a finished rollout: empty capture (compared with ``llm_base_url``, the endpoint the agent
    was given), failed calls, role filters, missing reward."""
    notes: list[str] = []
    llm_calls = rollout.llm_calls
    if not llm_calls:
        notes.append(_no_llm_call(rollout, recorder, llm_base_url))
    else:
        if all(call.status == "error" for call in llm_calls):
            first = llm_calls[0]
            notes.append(
                f"all {len(llm_calls)} LLM calls failed; the first to {first.metadata.get('endpoint')} "
                f"raised {first.error}."
            )
        for lost in filter(None, (_unfinished_note(recorder), _stray_note(rollout, llm_base_url))):
            notes.append(f"not every LLM call was captured: {lost}")
            logger.warning("rollout %s: %s", rollout.rollout_id, notes[-1])
    notes.extend(_role_notes(rollout))
    if rollout.status == "succeeded" and rollout.final_reward is None:
        notes.append(
            "no final reward: the agent returned None and did not call agl.emit_reward(value, final=True); "
            "return a float, call agl.emit_reward(..., final=True), or pass @agl.rollout(reward=fn)."
        )
    return notes


def _no_llm_call(rollout: Rollout, recorder: RolloutRecorder, expected: str) -> str:
    parts = ["no LLM call was captured."]
    if unfinished := _unfinished_note(recorder):
        parts.append(unfinished)
    adapters = installed_adapters()
    if "openai" in adapters:
        parts.append(f"The openai client is patched (installed capture adapters: {', '.join(adapters)}).")
    elif "openai" not in sys.modules:
        parts.append(
            "The openai client was never imported in this process, so it is not patched; requests sent with "
            "httpx are captured too, any other HTTP client only through the server's proxy."
        )
    else:
        parts.append(
            "The openai client is NOT patched (agl.uninstrument('openai') was called, or patching failed: see logs)."
        )
    parts.append(
        _stray_note(rollout, expected)
        or f"The agent was given llm.base_url={expected}; make sure it sends "
        "its requests there with the openai client (or a framework built on it), inside the rollout; other "
        "HTTP clients are captured only through the server's proxy."
    )
    return " ".join(parts)


def _unfinished_note(recorder: RolloutRecorder) -> str | None:
    """What to say about calls that started in the rollout and were never recorded (None when there were none)."""
    endpoints = sorted(recorder.unfinished_endpoints())
    if not endpoints:
        return None
    return (
        f"Calls to {', '.join(endpoints)} started but never finished (a stream that was never consumed or closed, "
        "or a call still running when the rollout ended)."
    )


def _stray_note(rollout: Rollout, expected: str) -> str | None:
    """What to say about openai calls made outside every rollout while this one ran (None when there were none)."""
    stray = stray_calls_since(rollout.timings["start"])
    if not stray:
        return None
    endpoint = stray[-1][1]
    note = (
        f"{len(stray)} openai call(s) ran while this rollout was running but outside its context, so no "
        f"rollout has them (last one to {endpoint}): threads started by the agent need "
        "contextvars.copy_context().run(...) (thread pools carry the context already), and clients must be called "
        "from the rollout's own task or thread."
    )
    if endpoint and endpoint != expected.rstrip("/"):
        note += f" Note that endpoint differs from llm.base_url={expected}."
    return note


def _role_notes(rollout: Rollout) -> list[str]:
    llm_calls = rollout.llm_calls
    if not llm_calls or rollout.trainable_roles is None:
        return []
    roles_seen = sorted({call.role for call in llm_calls if call.role is not None})
    unnamed = sum(1 for call in llm_calls if call.role is None)
    if not any(role_matches(call.role, rollout.trainable_roles) for call in llm_calls):
        note = (
            f"roles={rollout.trainable_roles} selected none of the {len(llm_calls)} LLM calls, so this rollout "
            f"gives no transitions; role names seen: {roles_seen or 'none'}"
        )
        if unnamed:
            note += (
                f" ({unnamed} calls had no role: name them with agl.role('...') or let a framework adapter name them)"
            )
        return [note + "."]
    missing = unmatched_patterns(rollout.trainable_roles, roles_seen)
    notes = []
    if unnamed:
        notes.append(
            f"{unnamed} of the {len(llm_calls)} LLM calls had no role, so roles={rollout.trainable_roles} "
            "cannot select them; name them with agl.role('...') or let a framework adapter name them."
        )
        logger.warning("rollout %s: %s", rollout.rollout_id, notes[-1])
    if not missing:
        return notes
    excluded = sorted({c.role or "<no role>" for c in llm_calls if not role_matches(c.role, rollout.trainable_roles)})
    return notes + [
        f"roles {missing} never appeared in this rollout; role names seen: {roles_seen}"
        + (f"; calls excluded as context only: {excluded}" if excluded else "")
        + "."
    ]
