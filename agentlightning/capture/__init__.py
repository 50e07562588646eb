"""Capture: the current rollout's recorder and role, ``agl.role``, ``agl.emit_reward``, the adapter registry,
diagnostics and OpenTelemetry spans.

Framework adapters (``agentlightning.adapters``) use only the names exported here.
"""

from agentlightning.capture._context import (
    LLMCall,
    RolloutRecorder,
    call_metadata,
    current_recorder,
    current_role,
    emit_reward,
    note_stray_call,
    recording,
    reset_role,
    set_role,
    stray_calls_since,
)
from agentlightning.capture._diagnostics import explain_rollout
from agentlightning.capture._instrument import enable_auto_instrumentation, installed_adapters, instrument, uninstrument
from agentlightning.capture._role import role
from agentlightning.capture._telemetry import emit_call_span
from agentlightning.types import role_matches, unmatched_patterns

__all__ = [
    "LLMCall",
    "RolloutRecorder",
    "call_metadata",
    "current_recorder",
    "current_role",
    "emit_call_span",
    "emit_reward",
    "enable_auto_instrumentation",
    "explain_rollout",
    "installed_adapters",
    "instrument",
    "note_stray_call",
    "recording",
    "reset_role",
    "role",
    "role_matches",
    "set_role",
    "stray_calls_since",
    "uninstrument",
    "unmatched_patterns",
]
