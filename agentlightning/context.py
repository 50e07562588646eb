"""Where captured data goes: the current rollout's recorder and the current role, held in ContextVars.

A ContextVar follows the code that set it into asyncio tasks created under it and into threads started
with ``contextvars.copy_context()``; parallel rollouts in separate threads, processes or tasks never mix.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
from collections.abc import Iterator
from contextvars import ContextVar, Token

from agentlightning.telemetry import tracing_enabled
from agentlightning.types import Call, Reward

logger = logging.getLogger(__name__)


class DeferredCall:
    """A call attached to its rollout when it starts; its :class:`Call` record is built once it has finished.

    Subclasses (capture adapters) set ``finished`` when the call ends and implement :attr:`endpoint` and
    :meth:`build`. A plain base class rather than a Protocol or ABC, so that telling entries apart stays a cheap
    ``isinstance`` on the path that builds a rollout's records.
    """

    __slots__ = ()
    finished: bool  # whether the call has ended (successfully or not)

    @property
    def endpoint(self) -> str | None:
        """The base URL the call went to, when known."""
        raise NotImplementedError

    def build(self) -> Call:
        """The record of the finished call, already carrying the rollout's id and model version; the same values
        every time (raising drops the call with a logged warning)."""
        raise NotImplementedError


class RolloutRecorder:
    """Collects the calls and rewards of one running rollout. Thread-safe; cheap to append to.

    Capture keeps the agent's LLM call path short: a call is attached as a :class:`DeferredCall` when it starts, and
    the records of finished calls are built together (with warm caches) when :attr:`calls` is next read, typically
    when the rollout ends.
    """

    def __init__(self, rollout_id: str, model_version: str | None = None) -> None:
        self.rollout_id = rollout_id
        self.model_version = model_version
        # Appended to and read without a lock (list.append is atomic); entries are only ever replaced in place.
        self._entries: list[Call | DeferredCall | None] = []
        self.rewards: list[Reward] = []
        self.logs: list[str] = []
        self._sequence = itertools.count()  # next() on it is atomic too
        # Whether the calls of this rollout are emitted as OpenTelemetry spans (decided once, when it starts).
        self.traced = tracing_enabled()

    @property
    def calls(self) -> list[Call]:
        """The finished calls attached so far, in sequence order (see :meth:`ordered_calls`)."""
        return self.ordered_calls()

    def next_sequence(self) -> int:
        """Reserve the next call position (calls are ordered by when they start)."""
        return next(self._sequence)

    def add_call(self, call: Call) -> None:
        """Attach a finished (or failed) call to this rollout (its rollout id and model version become this one's)."""
        if call.rollout_id != self.rollout_id:
            call.rollout_id = self.rollout_id
        if self.model_version is not None and "model_version" not in call.metadata:
            call.metadata["model_version"] = self.model_version
        self._entries.append(call)

    def start_call(self, entry: DeferredCall) -> int:
        """Attach a call as it starts; returns its sequence. Its record is built after it finishes."""
        self._entries.append(entry)
        return next(self._sequence)

    def unfinished_endpoints(self) -> set[str]:
        """Base URLs of the attached calls that have not finished (e.g. a stream never consumed)."""
        return {entry.endpoint or "an unknown endpoint" for entry in list(self._entries)
                if isinstance(entry, DeferredCall) and not entry.finished}

    def add_reward(self, reward: Reward) -> None:
        """Record a reward (episode-level or on a call)."""
        self.rewards.append(reward)

    def last_llm_call_id(self) -> str | None:
        """Id of the latest finished LLM call (the one started last), if any."""
        for call in reversed(self.calls):
            if call.kind == "llm":
                return call.call_id
        return None

    def ordered_calls(self) -> list[Call]:
        """The finished calls attached so far, sorted by sequence (the order they started); builds the records of
        calls that finished since the last read.

        Lock-free: building a record is deterministic, so two threads reading at once at worst build equal records.
        """
        calls: list[Call] = []
        entries = self._entries
        for index, entry in enumerate(entries):
            if entry is None:
                continue
            if isinstance(entry, DeferredCall):
                if not entry.finished:
                    continue
                try:
                    entry = entries[index] = entry.build()
                except Exception:  # noqa: BLE001 - a capture bug must not break the rollout
                    logger.warning("could not build the record of a captured call; it is dropped", exc_info=True)
                    entries[index] = None
                    continue
            calls.append(entry)
        return sorted(calls, key=lambda call: call.sequence)  # attached out of order when threads race


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


def rollouts_running() -> bool:
    """Whether a rollout is being recorded anywhere in this process (in any thread or task)."""
    return _open_recordings > 0


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
