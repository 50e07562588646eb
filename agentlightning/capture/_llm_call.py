"""One LLM call of a rollout as a client sees it, whichever client sends it: its place in the rollout is taken when
it starts, its ``Call`` record is built (by ``_wire.read``, as the server's proxy does) and added when it ends."""

from __future__ import annotations

import logging
import time
from typing import Any

from agentlightning._wire.read import build_call, fill_answer, request_fields
from agentlightning.capture._context import RolloutRecorder, current_role
from agentlightning.capture._telemetry import emit_call_span
from agentlightning.types import new_id

logger = logging.getLogger(__name__)


class LLMCall:
    """A call to ``api`` ('chat.completions', 'responses', ...) at ``endpoint`` starting now with request ``body``
    (a plain copy of what is sent), in the rollout of ``recorder``, with the role current now."""

    def __init__(self, api: str, recorder: RolloutRecorder, endpoint: str | None, body: dict[str, Any]) -> None:
        self.api = api
        self.recorder = recorder
        self.fields = request_fields(api, body)
        self.fields.update(call_id=new_id("call"), rollout_id=recorder.rollout_id, role=current_role(),
                           start_time=time.time())
        self.fields["metadata"].update(endpoint=endpoint, api=api)
        if recorder.model_version is not None:
            self.fields["metadata"]["model_version"] = recorder.model_version
        self.fields["sequence"] = recorder.start_call(endpoint)
        self.finished = False

    def finish(self, answer: dict[str, Any] | None, error: BaseException | None = None) -> None:
        """Add the call's record to the rollout (once): what the response answered, and ``error`` if it failed (the
        caller re-raises it)."""
        if self.finished:
            return
        self.finished = True
        try:
            fields = self.fields
            fields["end_time"] = time.time()
            if answer is not None:
                fill_answer(fields, answer, "response")
            if error is not None:
                fields.update(status="error", error=f"{type(error).__name__}: {error}")
                fields["metadata"]["error_type"] = type(error).__name__
                if getattr(error, "status_code", None):
                    fields["metadata"]["http_status"] = error.status_code  # type: ignore[attr-defined]
            call = build_call(fields)
            self.recorder.add_call(call)
            if self.recorder.traced:  # the span goes out now, under the agent's current trace context
                emit_call_span(call)
        except Exception:  # noqa: BLE001
            logger.warning("capture failed on a %s call; the agent continues", self.api, exc_info=True)
