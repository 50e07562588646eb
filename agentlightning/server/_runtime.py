"""What a running server holds besides its store: settings, the upstream model, stop and wake-up signals."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentlightning.protocol import Task, task_id_for
from agentlightning.server._metrics import Metrics
from agentlightning.server.store import Store
from agentlightning.types import role_matches


@dataclass(frozen=True)
class Route:
    """Calls of ``roles`` (globs) are served by ``model_name``, recorded with ``policy`` and ``model_version``."""

    roles: tuple[str, ...]
    model_name: str
    model_version: str | None = None
    policy: str | None = None


@dataclass(frozen=True)
class Upstream:
    """The OpenAI-compatible endpoint the proxy forwards to, and the model version it serves. ``sampling_overrides``
    are request fields forced on every forwarded call (the training temperature, for a backend like vLLM);
    ``translate_responses``: Responses API requests are sent as chat completions (a backend whose token ids come on
    chat completions only)."""

    url: str
    model_name: str | None = None
    model_version: str | None = None
    api_key: str | None = None
    logprobs: bool = False
    sampling_overrides: dict[str, Any] = field(default_factory=dict)
    max_tokens_limit: int | None = None  # the most tokens one answer may have; larger asks are capped
    routes: tuple[Route, ...] = ()
    translate_responses: bool = False

    def route(self, role: Any) -> Route | None:
        """The first route whose roles match ``role``, or None."""
        return next((r for r in self.routes if isinstance(role, str) and role_matches(role, r.roles)), None)


@dataclass(frozen=True)
class Settings:
    """Server behaviour. Seconds unless named otherwise. The proxy retries a failing upstream for
    ``upstream_retry_window``, waiting ``retry_backoff`` doubling to ``retry_backoff_max`` (jittered) or what
    ``Retry-After`` asks, and re-sends nothing once its agent left or its attempt ended; an upstream answer nobody
    waits for any more is awaited ``late_answer_grace`` more (recorded if it lands), then given up; a failed attempt
    is leased again after ``requeue_delay``, doubling up to ``requeue_delay_max``. A body over ``max_body_bytes`` is
    refused (413) before it is read; a proxied LLM request whose text (its body less the image and audio data inlined
    in it) is over ``max_prompt_bytes`` is refused (413) before it goes upstream: the server's work on a call grows
    with its token ids, up to one per byte of text, and 4 MiB of text is about a million tokens, more than the context
    window of the models one serves."""

    lease_seconds: float = 30.0
    rollout_timeout: float | None = 600.0
    max_attempts: int = 3
    max_body_bytes: int = 64 * 1024 * 1024
    max_prompt_bytes: int = 4 * 1024 * 1024  # a proxied LLM request, image and audio data not counted
    upstream_timeout: float = 600.0
    upstream_retry_window: float = 120.0
    late_answer_grace: float = 30.0
    retry_backoff: float = 0.25
    retry_backoff_max: float = 10.0
    requeue_delay: float = 2.0
    requeue_delay_max: float = 60.0
    dequeue_wait_max: float = 10.0
    flush_interval: float = 1.0  # retrying proxy call records whose write failed


@dataclass
class Runtime:
    """Shared state of a server process. Thread-safe where the in-process API (another thread) touches it."""

    store: Store
    settings: Settings = field(default_factory=Settings)
    token: str | None = None
    public_url: str | None = None
    upstream: Upstream | None = None
    metrics: Metrics = field(default_factory=Metrics)
    stop_requested: bool = False
    shutting_down: bool = False  # the server stops serving: upstream answers still awaited are given up at once
    upstream_paused: bool = False
    attached: list[str] = field(default_factory=list)
    _loop: asyncio.AbstractEventLoop | None = None
    _work: asyncio.Event | None = None
    _attach_cond: threading.Condition = field(default_factory=threading.Condition)

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Called once the server's event loop runs."""
        self._loop = loop
        self._work = asyncio.Event()

    def work_event(self) -> asyncio.Event:
        """The event set at the next wake-up (grab it *before* looking at the queue, then wait on it)."""
        assert self._work is not None, "server loop not started"
        return self._work

    def notify_work(self) -> None:
        """Wake up workers waiting for a rollout (callable from any thread)."""
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        if self._work is not None:
            self._work.set()
            self._work = asyncio.Event()

    def enqueue(
        self,
        tasks_or_dataset: str | Sequence[Any],
        *,
        group_size: int = 1,
        group_id: str | None = None,
        timeout: float | None = None,
        max_attempts: int | None = None,
    ) -> list[str]:
        """Queue ``group_size`` rollouts per task (a dataset id or a list of task payloads) and wake workers."""
        dataset_id = None
        if isinstance(tasks_or_dataset, str):
            dataset_id = tasks_or_dataset
            tasks = self.store.dataset_tasks(dataset_id)
        else:
            tasks = [Task(task_id=task_id_for(p, "task", i), payload=p) for i, p in enumerate(tasks_or_dataset)]
        ids = self.store.enqueue(
            tasks,
            group_size=group_size,
            group_id=group_id,
            dataset_id=dataset_id,
            timeout=timeout if timeout is not None else self.settings.rollout_timeout,
            max_attempts=max_attempts if max_attempts is not None else self.settings.max_attempts,
        )
        self.metrics.inc("agl_rollouts_enqueued_total", float(len(ids)))
        self.notify_work()
        return ids

    def request_stop(self) -> None:
        """Tell every worker to exit at its next request."""
        self.stop_requested = True
        self.notify_work()

    def attach(self, dataset_id: str) -> None:
        """A client announced it serves ``dataset_id``."""
        with self._attach_cond:
            if dataset_id not in self.attached:
                self.attached.append(dataset_id)
            self._attach_cond.notify_all()

    def wait_attached(self, timeout: float | None) -> str | None:
        """The first dataset a client attached, waiting up to ``timeout`` seconds."""
        with self._attach_cond:
            self._attach_cond.wait_for(lambda: bool(self.attached), timeout)
            return self.attached[0] if self.attached else None
