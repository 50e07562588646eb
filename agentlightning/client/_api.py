"""The client's side of the server protocol: typed calls over one ``httpx.Client``, retrying connection errors and
429/500/502/503/504 with backoff and jitter (or what ``Retry-After`` asks); other error answers raise
:class:`~agentlightning.protocol.ServerError`."""

from __future__ import annotations

import logging
import multiprocessing.synchronize
import os
import random
import threading
import time
from typing import Any

import httpx

from agentlightning import _json
from agentlightning.protocol import Lease, ResultOutcome, ServerError, Unreachable
from agentlightning.types import Rollout

logger = logging.getLogger(__name__)

_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
FIRST_DELAY = 0.05
"""Seconds before the first retry of a request; each next one waits twice as long, up to 5 s."""
StopSignal = threading.Event | multiprocessing.synchronize.Event


def resolve_server_url(server_url: str | None) -> str:
    """``server_url``, else ``$AGL_SERVER_URL``, else ``$AgentLightningServerUrl``."""
    url = server_url or os.environ.get("AGL_SERVER_URL") or os.environ.get("AgentLightningServerUrl")
    if not url:
        raise ValueError(
            "no server URL: pass server_url=... (agl client --server-url) or set AGL_SERVER_URL "
            "(AgentLightningServerUrl is accepted too), e.g. AGL_SERVER_URL=http://127.0.0.1:4747"
        )
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"server URL must start with http:// or https://, got {url!r}")
    return url.rstrip("/")


def resolve_token(token: str | None) -> str | None:
    """``token``, else ``$AGL_SERVER_TOKEN``."""
    return token or os.environ.get("AGL_SERVER_TOKEN") or None


class ServerAPI:
    """Typed calls to a Lightning Server (``server_url``, else ``$AGL_SERVER_URL``) over one thread-safe
    ``httpx.Client``: keep-alive connections, proxies from the environment and TLS settings as httpx reads them."""

    def __init__(self, server_url: str | None, token: str | None = None, *, timeout: float = 30.0) -> None:
        self.server_url = resolve_server_url(server_url)
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.server_url, headers=headers, timeout=timeout)

    def close(self) -> None:
        """Close connections."""
        self._http.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        retry_for: float | None = 60.0,
        stop: StopSignal | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Send a request and return its JSON answer, retrying transient failures for up to ``retry_for`` seconds
        (None: until ``stop`` is set)."""
        deadline = None if retry_for is None else time.monotonic() + retry_for
        delay = FIRST_DELAY
        while True:
            retry_after = ""
            try:
                response = self._http.request(
                    method,
                    path,
                    json=json,
                    params=params,
                    timeout=httpx.USE_CLIENT_DEFAULT if timeout is None else timeout,
                )
                if response.status_code not in _RETRY_STATUSES:
                    break
                problem = f"HTTP {response.status_code}: {_detail(response)}"
                retry_after = response.headers.get("retry-after", "").strip()
            except httpx.TransportError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            pause = max(delay * random.uniform(0.5, 1.0), float(retry_after) if retry_after.isdigit() else 0.0)
            if (deadline is not None and time.monotonic() + pause > deadline) or (stop is not None and stop.is_set()):
                raise Unreachable(f"{method} {self.server_url}{path} failed: {problem}")
            if delay == FIRST_DELAY:  # the first retry of this request says so, loudly
                logger.warning(
                    "server %s not answering (%s); retrying for up to %s",
                    self.server_url,
                    problem,
                    "until stopped" if retry_for is None else f"{retry_for:.0f} s",
                )
            else:
                logger.info("server %s not answering (%s); retrying in %.2f s", self.server_url, problem, pause)
            (stop or threading.Event()).wait(pause)  # a sleep that ``stop`` cuts short
            delay = min(delay * 2, 5.0)
        if response.is_error:
            raise ServerError(response.status_code, _detail(response))
        return response.json()

    def health(self, retry_for: float | None = 30.0) -> dict[str, Any]:
        """``GET /health``, waiting up to ``retry_for`` seconds for the server to come up."""
        return self.request("GET", "/health", retry_for=retry_for)

    def dequeue(
        self, worker_id: str, wait: float, stop: StopSignal | None = None, retry_for: float | None = 600.0
    ) -> tuple[Lease | None, bool]:
        """Long-poll for a rollout: returns (lease or None, whether the server says stop). A server that is down
        (restarting) is waited for up to ``retry_for`` seconds, or until ``stop`` is set."""
        body = self.request(
            "POST",
            f"/workers/{worker_id}/dequeue",
            params={"wait": wait},
            retry_for=retry_for,
            stop=stop,
            timeout=wait + 30.0,
        )
        return _lease(body), bool(body.get("stop"))

    def heartbeat(self, rollout_id: str, attempt: int, worker_id: str) -> dict[str, Any]:
        """Extend the lease; ``{"ok": False}`` means the attempt was taken away (abandon it)."""
        return self.request(
            "POST",
            f"/rollouts/{rollout_id}/heartbeat",
            json={"attempt": attempt, "worker_id": worker_id},
            retry_for=5.0,
        )

    def upload_result(
        self, rollout: Rollout, attempt: int, worker_id: str | None, retry_for: float | None = 600.0
    ) -> ResultOutcome:
        """Report a finished attempt (idempotent: safe to repeat)."""
        return ResultOutcome.model_validate(self._post_result(rollout, attempt, worker_id, retry_for))

    def upload_result_and_lease(
        self, rollout: Rollout, attempt: int, worker_id: str, retry_for: float | None = 600.0
    ) -> tuple[ResultOutcome, Lease | None, bool]:
        """Report a finished attempt and take ``worker_id``'s next lease in the same request: returns (what was
        done with the result, the next lease or None when the queue is empty, whether the server says stop)."""
        answer = self._post_result(rollout, attempt, worker_id, retry_for, params={"next": 1})
        following = answer.get("next") or {}
        return ResultOutcome.model_validate(answer), _lease(following), bool(following.get("stop"))

    def _post_result(
        self,
        rollout: Rollout,
        attempt: int,
        worker_id: str | None,
        retry_for: float | None,
        params: dict[str, Any] | None = None,
    ) -> Any:
        # an agent's own text (logs, outputs) may hold lone surrogates: made safe here rather than refused upstream
        body = {"attempt": attempt, "worker_id": worker_id, "rollout": _json.scrub(rollout.model_dump(mode="json"))}
        return self.request(
            "POST", f"/rollouts/{rollout.rollout_id}/result", json=body, params=params, retry_for=retry_for
        )


def _lease(body: dict[str, Any]) -> Lease | None:
    lease = body.get("lease")
    return Lease.model_validate(lease) if lease else None


def _detail(response: httpx.Response) -> str:
    """The server's message: FastAPI's ``detail``, an OpenAI-style ``error.message``, else the body's start."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"])
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message"))
    return str(body)[:500]
