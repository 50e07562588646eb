"""Where captured data goes: the current rollout's recorder and the current role, held in ContextVars (they follow
the code into asyncio tasks and into threads started with ``contextvars.copy_context()``), ``agl.emit_reward``, and
:class:`LLMCall`, one LLM call as a client sees it (its place taken when it starts, its ``Call`` built by
``_wire.read`` as the proxy's are and added when it ends)."""

from __future__ import annotations

import contextlib
import itertools
import logging
import operator
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextvars import ContextVar, Token
from typing import Any

from agentlightning._wire.read import build_call, fill_answer, request_fields
from agentlightning.capture._telemetry import emit_call_span, tracing_enabled
from agentlightning.types import Call, Reward, check_finite, new_id

logger = logging.getLogger(__name__)


class RolloutRecorder:
    """Collects the calls and rewards of one running rollout. Thread-safe."""

    def __init__(self, rollout_id: str, model_version: str | None = None) -> None:
        self.rollout_id = rollout_id
        self.model_version = model_version
        self._calls: list[Call] = []
        self._unfinished: dict[int, str | None] = {}  # sequence -> endpoint of the calls started, not yet recorded
        self.rewards: list[Reward] = []
        self.logs: list[str] = []
        self._sequence = itertools.count()  # next() on it is atomic
        self._lock = threading.Lock()
        self.traced = tracing_enabled()  # whether its calls are emitted as OpenTelemetry spans (decided at start)

    @property
    def calls(self) -> list[Call]:
        """The calls recorded so far, sorted by sequence (the order they started)."""
        with self._lock:
            return sorted(self._calls, key=operator.attrgetter("sequence"))

    def next_sequence(self) -> int:
        """Reserve the next call position (calls are ordered by when they start)."""
        return next(self._sequence)

    def start_call(self, endpoint: str | None) -> int:
        """Reserve the position of a call to ``endpoint`` that starts now (unfinished until :meth:`add_call`)."""
        with self._lock:
            sequence = next(self._sequence)
            self._unfinished[sequence] = endpoint
        return sequence

    def add_call(self, call: Call) -> None:
        """Attach a finished (or failed) call to this rollout (its rollout id and model version become this one's)."""
        call.rollout_id = self.rollout_id
        if self.model_version is not None and "model_version" not in call.metadata:
            call.metadata["model_version"] = self.model_version
        with self._lock:
            self._unfinished.pop(call.sequence, None)
            self._calls.append(call)

    def unfinished_endpoints(self) -> set[str]:
        """Base URLs of the calls started but not recorded (e.g. a stream never consumed)."""
        with self._lock:
            return {endpoint or "an unknown endpoint" for endpoint in self._unfinished.values()}


_current_recorder: ContextVar[RolloutRecorder | None] = ContextVar("agl_current_recorder", default=None)
_current_role: ContextVar[str | None] = ContextVar("agl_current_role", default=None)


def current_recorder() -> RolloutRecorder | None:
    """The recorder of the rollout running in this context, or None outside rollouts."""
    return _current_recorder.get()


def current_role() -> str | None:
    """The role speaking now (innermost ``agl.role`` or framework adapter), or None."""
    return _current_role.get()


def set_role(role: str | None) -> Token[str | None]:
    """Make ``role`` current; pass the returned token to :func:`reset_role`."""
    return _current_role.set(role)


def reset_role(token: Token[str | None]) -> None:
    """Undo :func:`set_role`. Tolerates tokens from another context (framework callbacks may cross them)."""
    try:
        _current_role.reset(token)
    except ValueError:
        _current_role.set(token.old_value if token.old_value is not Token.MISSING else None)


_open_recordings = 0  # recording() blocks open in this process, in any thread or task
_open_recordings_lock = threading.Lock()
# (unix time, base URL) of the latest LLM calls made outside any rollout while one was running, for diagnostics.
_stray_calls: deque[tuple[float, str | None]] = deque(maxlen=64)


def note_stray_call(endpoint: str | None) -> None:
    """Tell capture that an LLM call was made outside every rollout (kept only while some rollout is running)."""
    if _open_recordings > 0:
        _stray_calls.append((time.time(), endpoint))


def stray_calls_since(start: float) -> list[tuple[float, str | None]]:
    """(time, base URL) of the recent LLM calls made outside any rollout since unix time ``start``."""
    return [(when, endpoint) for when, endpoint in list(_stray_calls) if when >= start]


@contextlib.contextmanager
def recording(recorder: RolloutRecorder) -> Iterator[RolloutRecorder]:
    """Run a block with ``recorder`` current."""
    global _open_recordings
    with _open_recordings_lock:
        _open_recordings += 1
    token = _current_recorder.set(recorder)
    try:
        yield recorder
    finally:
        _current_recorder.reset(token)
        with _open_recordings_lock:
            _open_recordings -= 1


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


_call_metadata: ContextVar[dict[str, Any] | None] = ContextVar("agl_call_metadata", default=None)


@contextlib.contextmanager
def call_metadata(**fields: Any) -> Iterator[None]:
    """Add ``fields`` to the metadata of every LLM call that starts inside (e.g. a framework's own model string)."""
    token = _call_metadata.set({**(_call_metadata.get() or {}), **fields})
    try:
        yield
    finally:
        _call_metadata.reset(token)


class LLMCall:
    """A call to ``api`` ('chat.completions', 'responses', ...) at ``endpoint`` starting now with request ``body``
    (a plain copy of what is sent), in the rollout of ``recorder``, with the role current now."""

    def __init__(self, api: str, recorder: RolloutRecorder, endpoint: str | None, body: dict[str, Any]) -> None:
        self.api = api
        self.recorder = recorder
        self.fields = request_fields(api, body)
        self.fields.update(
            call_id=new_id("call"), rollout_id=recorder.rollout_id, role=current_role(), start_time=time.time()
        )
        self.fields["metadata"].update(_call_metadata.get() or {})
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
