"""``LightningServer``: the server (store, rollout queue, proxy) run in-process, on a background thread."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from agentlightning._uvicorn import BackgroundServer
from agentlightning.protocol import ModelVersion
from agentlightning.server._app import create_app
from agentlightning.server._auth import check_bind
from agentlightning.server._runtime import Route, Runtime, Settings, Upstream
from agentlightning.server.store import SQLiteStore, Store
from agentlightning.types import Rollout

logger = logging.getLogger(__name__)


class LightningServer:
    """The Lightning Server in this process.

    ``store_path`` is the SQLite file (created if missing; reopening it resumes where the last server stopped).
    ``upstream_url`` is any OpenAI-compatible base URL (``http://host:port/v1``); it can be set or changed later
    with :meth:`set_upstream`. Listening beyond loopback requires ``token``. ``port=0`` picks a free port.

        with LightningServer("runs/store.db", upstream_url="http://127.0.0.1:8000/v1") as server:
            ids = server.enqueue([{"question": "2+2"}], group_size=4)
            rollouts = server.wait(ids)
    """

    def __init__(
        self,
        store_path: str | Path = "agl-store.db",
        upstream_url: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        *,
        model_name: str | None = None,
        model_version: str | None = None,
        upstream_api_key: str | None = None,
        logprobs: bool = False,
        translate_responses: bool = False,
        settings: Settings | None = None,
        public_url: str | None = None,
        store: Store | None = None,
    ) -> None:
        check_bind(host, token)
        self.host = host
        self._public_url = public_url
        settings = settings or Settings()
        store = store or SQLiteStore(
            store_path,
            requeue_delay=settings.requeue_delay,
            requeue_delay_max=settings.requeue_delay_max,
            exclusive=True,  # a second server on this store file is refused (StoreInUse)
            lease_seconds=settings.lease_seconds,
        )
        self.runtime = Runtime(store=store, settings=settings, token=token)
        # before any set_upstream
        self._defaults = Upstream(
            url="", api_key=upstream_api_key, logprobs=logprobs, translate_responses=translate_responses
        )
        if upstream_url is not None:
            try:
                self.set_upstream(upstream_url, model_name, model_version, api_key=upstream_api_key, logprobs=logprobs)
            except BaseException:
                store.close()  # its lock too: a corrected retry can open the store
                raise
        self._http = BackgroundServer(
            create_app(self.runtime),
            host,
            port,
            name="LightningServer",
            lifespan="on",
            timeout_graceful_shutdown=3,
            backlog=4096,
            timeout_keep_alive=75,
            proxy_headers=False,
            server_header=False,
        )

    @property
    def url(self) -> str:
        """``http://host:port`` of the running server (the address clients use unless ``public_url`` was given)."""
        return (self._public_url or self._http.url).rstrip("/")

    @property
    def port(self) -> int:
        """The port listened on (known once started when ``port=0``)."""
        return self._http.port

    @property
    def store(self) -> Store:
        """The store (usable directly for queries)."""
        return self.runtime.store

    def start(self) -> LightningServer:
        """Bind and serve on a background thread; returns once requests are accepted. A server that cannot start
        (its port taken) closes its store, so another server can open it."""
        try:
            self._http.start()
        except BaseException:
            self.store.close()
            raise
        self.runtime.public_url = self.url
        logger.info("Lightning server listening on %s (store %s)", self.url, getattr(self.store, "path", "?"))
        return self

    def stop(self) -> None:
        """Stop serving and close the store (everything written stays on disk). Proxied calls still awaiting their
        upstream answer are given up (recorded, answered 503) rather than cut by the shutdown."""
        self.runtime.shutting_down = True
        self._http.stop()
        self.store.close()

    def __enter__(self) -> LightningServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def set_upstream(
        self,
        url: str,
        model_name: str | None = None,
        model_version: str | None = None,
        *,
        api_key: str | None = None,
        logprobs: bool | None = None,
        sampling_overrides: dict[str, Any] | None = None,
        max_tokens_limit: int | None = None,
        routes: Sequence[Route] | None = None,
        translate_responses: bool | None = None,
    ) -> ModelVersion:
        """Forward the proxy to ``url`` serving ``model_name``; calls recorded from now on carry ``model_version``
        (default: ``model_name``). ``logprobs=True`` asks for sampling logprobs on every call; ``sampling_overrides``
        (e.g. ``{"temperature": 1.0}``) replace those fields of every forwarded request; ``max_tokens_limit`` caps
        the tokens a request may ask for (a trainer's ``max_completion_length``); ``routes`` serve some roles
        by other models (one policy per role); ``translate_responses=True`` sends Responses API requests upstream as
        chat completions (for a backend that serves only those, or whose token ids come only on them). Unset
        arguments keep the previous upstream's (else the constructor's) value."""
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"upstream url must start with http:// or https://, got {url!r}")
        current = self.runtime.upstream or self._defaults
        version = model_version or model_name or "unversioned"
        self.runtime.upstream = Upstream(
            url=url.rstrip("/"),
            model_name=model_name,
            model_version=version,
            api_key=api_key if api_key is not None else current.api_key,
            logprobs=logprobs if logprobs is not None else current.logprobs,
            sampling_overrides=dict(current.sampling_overrides if sampling_overrides is None else sampling_overrides),
            max_tokens_limit=max_tokens_limit if max_tokens_limit is not None else current.max_tokens_limit,
            routes=tuple(current.routes if routes is None else routes),
            translate_responses=current.translate_responses if translate_responses is None else translate_responses,
        )
        return self.store.set_model_version(version, model_name or "", url)

    @contextlib.contextmanager
    def upstream_paused(self) -> Iterator[None]:
        """Hold the proxy's LLM requests (they wait; none fails) while the model backend restarts or loads new
        weights, e.g. ``with server.upstream_paused(): backend.update(weights)``."""
        self.runtime.upstream_paused = True
        try:
            yield
        finally:
            self.runtime.upstream_paused = False

    def add_dataset(self, records: Sequence[Any], dataset_id: str | None = None, name: str | None = None) -> str:
        """Store tasks and return the dataset id (content-derived unless given; re-adding is a no-op)."""
        return self.store.add_dataset(records, dataset_id=dataset_id, name=name).dataset_id

    def enqueue(
        self,
        tasks_or_dataset_id: str | Sequence[Any],
        group_size: int = 1,
        group_id: str | None = None,
        *,
        timeout: float | None = None,
        max_attempts: int | None = None,
    ) -> list[str]:
        """Queue ``group_size`` rollouts for each task (a dataset id, or task payloads). Rollouts of one task share
        the group id ``f"{group_id}:{task_id}"`` (``group_id`` defaults to a fresh id)."""
        return self.runtime.enqueue(
            tasks_or_dataset_id, group_size=group_size, group_id=group_id, timeout=timeout, max_attempts=max_attempts
        )

    def wait(self, rollout_ids: Sequence[str], timeout: float | None = None) -> list[Rollout]:
        """Block until every rollout finished; returns them in the given order with calls joined. Raises
        ``TimeoutError`` (saying how many are unfinished) after ``timeout`` seconds."""
        ids = list(rollout_ids)
        pending = set(ids)
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.005
        while pending:
            pending -= self.store.finished(pending)
            if not pending:
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(
                    f"{len(pending)} of {len(ids)} rollouts unfinished after {timeout} s, "
                    f"e.g. {sorted(pending)[:3]}; counts: {self.store.counts()}"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 0.2)
        return [self.store.get_rollout(rollout_id) for rollout_id in ids]  # type: ignore[misc]

    def request_stop(self) -> None:
        """Tell clients to exit: their next request is answered with ``stop``."""
        self.runtime.request_stop()

    def wait_for_dataset(self, timeout: float | None = None) -> str | None:
        """The dataset id the first client attached (``Client.train``), waiting up to ``timeout`` seconds."""
        return self.runtime.wait_attached(timeout)
