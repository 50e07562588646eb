"""One attempt: run an agent once on a task with capture on, under a deadline, and finish its rollout (every
rollout of ``agl.run``, ``RolloutAgent.execute`` and the client's workers is an :class:`Attempt`)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import json
import logging
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from agentlightning import _json
from agentlightning.capture import (
    RolloutRecorder,
    current_recorder,
    enable_auto_instrumentation,
    explain_rollout,
    recording,
)
from agentlightning.protocol import task_id_for
from agentlightning.types import LLM, ErrorInfo, Reward, Rollout, RolloutStatus, check_finite, new_id

logger = logging.getLogger(__name__)


class Agent(Protocol):
    """What an attempt needs of the agent: an ``@agl.rollout`` function (:class:`agentlightning.RolloutAgent`)."""

    name: str
    roles: list[str] | None
    reward: Callable[[Any, Any], Any] | None
    is_async: bool

    def invoke(self, task: Any, llm: LLM, rollout: Rollout) -> Any: ...


class Attempt:
    """One run of ``agent`` on ``task`` against ``llm``, recorded into :attr:`rollout`: :meth:`run` or :meth:`arun`."""

    def __init__(
        self,
        agent: Agent,
        task: Any,
        llm: LLM,
        *,
        rollout_id: str | None = None,
        task_id: str | None = None,
        group_id: str | None = None,
        attempt: int = 1,
    ) -> None:
        self.agent, self.task, self.llm = agent, task, llm
        self.rollout = Rollout(
            rollout_id=rollout_id or new_id("ro"),
            task_id=task_id or task_id_for(task),
            task=task,
            group_id=group_id,
            attempt=attempt,
            status="running",
            model_version=llm.model_version,
            trainable_roles=agent.roles,
            timings={"start": time.time()},
        )
        self.recorder = RolloutRecorder(self.rollout.rollout_id, model_version=llm.model_version)
        self._returned = threading.Event()
        self._thread: threading.Thread | None = None
        self._output: Any = None
        self._error: BaseException | None = None

    @property
    def abandoned(self) -> bool:
        """Whether the agent had not returned when :meth:`run` returned (hung, or taken away). An agent that returned
        is not abandoned while its thread still ends (finalizing thread-local objects: a session closing)."""
        return self._thread is not None and not self._returned.is_set()

    def start(self) -> None:
        """Check the task (``ValueError`` naming the agent if it is not JSON-serialisable) and install capture."""
        try:
            json.dumps(self.task)
        except (TypeError, ValueError) as exc:
            message = f"task for agent {self.agent.name!r} is not JSON-serialisable ({exc}): {preview(self.task)}"
            raise ValueError(message) from None
        enable_auto_instrumentation()
        logging.getLogger().addHandler(_LOG_HANDLER)  # once per process: addHandler skips a handler already there

    def run(
        self, timeout: float | None = None, on_tick: Callable[[], bool] | None = None, tick: float = 1.0
    ) -> Rollout:
        """Run the agent on a daemon thread (with a copy of this context) and return the finished rollout: at
        ``timeout`` seconds as 'timeout' (the thread is left running); ``on_tick`` is called every ``tick`` seconds
        meanwhile (a heartbeat) and returns False when the attempt was taken away ('cancelled'). Agent errors are
        recorded, never raised; a task that cannot start raises (see :meth:`start`)."""
        self.start()
        self._thread = threading.Thread(
            target=contextvars.copy_context().run,
            args=(self._call,),
            daemon=True,
            name=f"agl-{self.rollout.rollout_id}",
        )
        self._thread.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            waits = ([tick] if on_tick else []) + ([deadline - time.monotonic()] if deadline is not None else [])
            if self._returned.wait(max(0.0, min(waits)) if waits else None):
                return self._finish()
            if deadline is not None and time.monotonic() >= deadline:
                return self._timed_out(timeout)
            if on_tick is not None and not on_tick():
                return self._close("cancelled", ErrorInfo(type="Cancelled", message="the attempt was taken away"))

    async def arun(self, timeout: float | None = None) -> Rollout:
        """:meth:`run` on an event loop: an async agent runs on this loop and is cancelled at ``timeout``; a sync
        agent runs as in :meth:`run`, waited for from a daemon thread (a hung one cannot hold up interpreter exit)."""
        if not self.agent.is_async:
            return await _on_daemon_thread(lambda: self.run(timeout))
        self.start()
        deadline = asyncio.timeout(timeout)
        try:
            with recording(self.recorder):
                async with deadline:
                    self._output = await self.agent.invoke(self.task, self.llm, self.rollout)
        except Exception as exc:  # noqa: BLE001 - agent failures are data
            if isinstance(exc, TimeoutError) and deadline.expired():
                return self._timed_out(timeout)
            self._error = exc  # includes a TimeoutError the agent raised itself
        return self._finish()

    def refuse(self, message: str, exc: BaseException) -> Rollout:
        """Finish as 'failed' without the agent having run (the attempt could not start), saying why."""
        rollout = self.rollout
        logger.warning("rollout %s of agent %r: %s", rollout.rollout_id, self.agent.name, message)
        rollout.task = _jsonable(rollout.task, limit=200)  # keep the record storable
        rollout.status, rollout.diagnostics = "failed", [message]
        rollout.error = ErrorInfo(type=type(exc).__name__, message=message)
        rollout.timings.update(end=rollout.timings["start"], duration=0.0)
        return rollout

    def _call(self) -> None:
        """The agent's thread: call it with the recorder current; an awaitable it returns runs on a loop here."""
        try:
            with recording(self.recorder):
                output = self.agent.invoke(self.task, self.llm, self.rollout)
                self._output = asyncio.run(_awaited(output)) if inspect.isawaitable(output) else output
        except BaseException as exc:  # noqa: BLE001 - agent failures are data
            self._error = exc
        finally:
            self._returned.set()

    def _finish(self) -> Rollout:
        """Finish from what the agent returned or raised: applies ``reward=`` and validates the reward."""
        error, value = self._error, None
        if error is None:
            try:
                value = self._reward_value(self._output)
            except Exception as exc:  # noqa: BLE001 - a bad reward fails this rollout only
                error = exc
        if error is not None:
            logger.warning(
                "rollout %s of agent %r failed: %s: %s",
                self.rollout.rollout_id,
                self.agent.name,
                type(error).__name__,
                error,
            )
            return self._close(
                "failed",
                ErrorInfo(
                    type=type(error).__name__, message=str(error), traceback="".join(traceback.format_exception(error))
                ),
            )
        if self.agent.reward is not None or value is None:
            self.rollout.output = _jsonable(self._output)
        if value is not None:
            self.recorder.rewards.append(Reward(value=value, source="final"))
        return self._close("succeeded")

    def _reward_value(self, output: Any) -> float | None:
        where = f"agent {self.agent.name!r} on task {self.rollout.task_id!r}"
        if self.agent.reward is not None:
            output = self.agent.reward(self.task, output)
            where = f"reward function {name_of(self.agent.reward)!r} for {where}"
        elif output is not None and (isinstance(output, bool) or not isinstance(output, (int, float))):
            raise TypeError(
                f"{where} returned {type(output).__name__} {preview(output)}; expected a float reward or None. "
                "To keep returning the answer, name a scorer: @agl.rollout(reward=score) with score(task, output)."
            )
        return None if output is None else check_finite(output, where)

    def _timed_out(self, timeout: float | None) -> Rollout:
        logger.warning("rollout %s of agent %r timed out after %s s", self.rollout.rollout_id, self.agent.name, timeout)
        message = f"agent {self.agent.name!r} did not finish within {timeout} s"
        return self._close("timeout", ErrorInfo(type="Timeout", message=message))

    def _close(self, status: RolloutStatus, error: ErrorInfo | None = None) -> Rollout:
        rollout, recorder = self.rollout, self.recorder
        rollout.status, rollout.error = status, error
        rollout.calls = recorder.calls
        rollout.rewards = list(recorder.rewards)
        rollout.logs.extend(recorder.logs)
        rollout.final_reward = next((r.value for r in reversed(rollout.rewards) if r.source == "final"), None)
        rollout.timings["end"] = time.time()
        rollout.timings["duration"] = rollout.timings["end"] - rollout.timings["start"]
        rollout.diagnostics = explain_rollout(rollout, recorder, self.llm.base_url)
        self._refuse_non_finite(rollout)
        return rollout

    def _refuse_non_finite(self, rollout: Rollout) -> None:
        """A NaN or Infinity in what the rollout keeps (its output, timings, calls) cannot travel as JSON (it would be
        stored as null): a succeeded rollout is failed saying where, its other data kept."""
        where = _json.non_finite(rollout.model_dump(include={"output", "timings", "calls"}))
        if not where:
            return
        message = (
            f"the rollout holds NaN or Infinity at {', '.join(where)}: JSON has no such numbers (they would be stored "
            "as null); make the agent return finite numbers or None there"
        )
        logger.warning("rollout %s of agent %r: %s", rollout.rollout_id, self.agent.name, message)
        rollout.diagnostics.append(message)
        if rollout.status == "succeeded":
            rollout.status, rollout.error = "failed", ErrorInfo(type="NonFiniteNumber", message=message)


class _RolloutLogs(logging.Handler):
    """Copies log records emitted inside a rollout's context into that rollout's ``logs``."""

    def emit(self, record: logging.LogRecord) -> None:
        recorder = current_recorder()
        try:
            if recorder is not None:
                recorder.logs.append(
                    f"{time.strftime('%H:%M:%S')} {record.levelname} {record.name}: {record.getMessage()}"
                )
        except Exception:  # noqa: BLE001 - a bad log message must never break the agent
            pass


_LOG_HANDLER = _RolloutLogs(logging.INFO)


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


async def _on_daemon_thread(func: Callable[[], Rollout]) -> Rollout:
    """``func()`` run on a daemon thread of its own (with a copy of this context), awaited."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Rollout] = loop.create_future()

    def target() -> None:
        try:
            outcome = functools.partial(done.set_result, func())
        except BaseException as exc:  # noqa: BLE001 - raised in the awaiting task
            outcome = functools.partial(done.set_exception, exc)
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile (the caller was interrupted)
            loop.call_soon_threadsafe(lambda: done.done() or outcome())

    threading.Thread(target=contextvars.copy_context().run, args=(target,), name="agl-attempt", daemon=True).start()
    return await done


def _jsonable(value: Any, limit: int | None = None) -> Any:
    """``value`` if it is JSON-serialisable, else its ``repr`` (cut to ``limit`` characters)."""
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value) if limit is None else preview(value, limit)


def preview(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, for error messages that name a bad value."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def name_of(func: Callable[..., Any]) -> str:
    """A function's qualified name, for messages."""
    return getattr(func, "__qualname__", getattr(func, "__name__", repr(func)))
