"""The client's side of the server protocol: HTTP calls with retries and backoff.

Connection errors and 502/503/504 answers are retried with exponential backoff (a server restarting is waited
for); 4xx answers raise :class:`ServerError` with the server's message.
"""

from __future__ import annotations

import json as jsonlib
import logging
import os
import time
from typing import Any, Protocol
from urllib.parse import urlsplit
from urllib.request import getproxies_environment, proxy_bypass_environment

from agentlightning.client.http import HttpxTransport, KeepAliveHTTP, Transport, TransportError
from agentlightning.protocol import Lease, ResultOutcome
from agentlightning.types import Rollout

logger = logging.getLogger(__name__)

SERVER_URL_VARIABLES = ("AGL_SERVER_URL", "AgentLightningServerUrl")
TOKEN_VARIABLE = "AGL_SERVER_TOKEN"
_RETRY_STATUSES = frozenset({502, 503, 504})


class StopSignal(Protocol):
    """Anything with ``is_set()`` and ``wait(timeout)``: a threading or multiprocessing Event."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class ServerError(RuntimeError):
    """The server refused a request (4xx/5xx that retrying will not fix)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"server answered {status}: {message}")
        self.status = status
        self.message = message


class Unreachable(RuntimeError):
    """The server could not be reached before the retry deadline (or the caller asked to stop)."""


def resolve_server_url(server_url: str | None) -> str:
    """``server_url``, else ``$AGL_SERVER_URL``, else ``$AgentLightningServerUrl``."""
    url = server_url or next((os.environ[name] for name in SERVER_URL_VARIABLES if os.environ.get(name)), None)
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
    return token or os.environ.get(TOKEN_VARIABLE) or None


class ServerAPI:
    """Typed calls to a Lightning Server (thread-safe; one pooled connection set per instance)."""

    def __init__(self, server_url: str, token: str | None = None, *, timeout: float = 30.0) -> None:
        self.server_url = server_url.rstrip("/")
        self.timeout = timeout
        headers = {"authorization": f"Bearer {token}"} if token else {}
        proxies, host = getproxies_environment(), urlsplit(self.server_url).hostname or ""
        proxied = (proxies.get(self.server_url.split(":")[0]) or proxies.get("all")) and not proxy_bypass_environment(
            host, proxies)
        self._http: Transport = (HttpxTransport(self.server_url, headers) if proxied
                                 else KeepAliveHTTP(self.server_url, headers))

    def close(self) -> None:
        """Close connections."""
        self._http.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        content: bytes | None = None,
        headers: dict[str, str] | None = None,
        params: dict[str, Any] | None = None,
        retry_for: float | None = 60.0,
        stop: StopSignal | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Send a request, retrying transient failures for up to ``retry_for`` seconds (None: until ``stop``)."""
        deadline = None if retry_for is None else time.monotonic() + retry_for
        delay = 0.05
        headers = dict(headers or {})
        if json is not None:
            content = jsonlib.dumps(json).encode()
            headers.setdefault("content-type", "application/json")
        while True:
            try:
                status, data = self._http.request(method, path, body=content, headers=headers, params=params,
                                                  timeout=timeout if timeout is not None else self.timeout)
                if status not in _RETRY_STATUSES:
                    break
                problem = f"HTTP {status}"
            except TransportError as exc:
                problem = str(exc)
            if (deadline is not None and time.monotonic() + delay > deadline) or (stop is not None and stop.is_set()):
                raise Unreachable(f"{method} {self.server_url}{path} failed: {problem}")
            logger.info("server %s not answering (%s); retrying in %.2f s", self.server_url, problem, delay)
            if stop is not None:
                stop.wait(delay)
            else:
                time.sleep(delay)
            delay = min(delay * 2, 2.0)
        if status >= 400:
            raise ServerError(status, _detail(data))
        return jsonlib.loads(data)

    # -- protocol --------------------------------------------------------------------------------------------

    def health(self, retry_for: float | None = 30.0) -> dict[str, Any]:
        """``GET /health``, waiting up to ``retry_for`` seconds for the server to come up."""
        return self.request("GET", "/health", retry_for=retry_for)

    def dequeue(
        self, worker_id: str, wait: float, stop: StopSignal | None = None, retry_for: float | None = 600.0
    ) -> tuple[Lease | None, bool]:
        """Long-poll for a rollout: returns (lease or None, whether the server says stop). A server that is down
        (restarting) is waited for up to ``retry_for`` seconds, or until ``stop`` is set."""
        body = self.request("POST", f"/workers/{worker_id}/dequeue", params={"wait": wait}, retry_for=retry_for,
                            stop=stop, timeout=wait + 30.0)
        lease = body.get("lease")
        return (Lease.model_validate(lease) if lease else None), bool(body.get("stop"))

    def heartbeat(self, rollout_id: str, attempt: int, worker_id: str) -> dict[str, Any]:
        """Extend the lease; ``{"ok": False}`` means the attempt was taken away (abandon it)."""
        return self.request("POST", f"/rollouts/{rollout_id}/heartbeat",
                            json={"attempt": attempt, "worker_id": worker_id}, retry_for=5.0)

    def upload_result(
        self, rollout: Rollout, attempt: int, worker_id: str | None, retry_for: float | None = 600.0
    ) -> ResultOutcome:
        """Report a finished attempt (idempotent: safe to repeat)."""
        return ResultOutcome.model_validate(self._post_result(rollout, attempt, worker_id, retry_for, ""))

    def upload_result_and_lease(
        self, rollout: Rollout, attempt: int, worker_id: str, retry_for: float | None = 600.0
    ) -> tuple[ResultOutcome, Lease | None, bool]:
        """Report a finished attempt and take ``worker_id``'s next lease in the same request: returns (what was
        done with the result, the next lease or None when the queue is empty, whether the server says stop)."""
        answer = self._post_result(rollout, attempt, worker_id, retry_for, "?next=1")
        following = answer.get("next") or {}
        lease = following.get("lease")
        return (ResultOutcome.model_validate(answer), Lease.model_validate(lease) if lease else None,
                bool(following.get("stop")))

    def _post_result(
        self, rollout: Rollout, attempt: int, worker_id: str | None, retry_for: float | None, query: str
    ) -> Any:
        head = jsonlib.dumps({"attempt": attempt, "worker_id": worker_id})[:-1]
        body = f'{head}, "rollout": {rollout.model_dump_json()}}}'.encode()  # serialised once, by pydantic
        return self.request("POST", f"/rollouts/{rollout.rollout_id}/result{query}", content=body,
                            headers={"content-type": "application/json"}, retry_for=retry_for)

    def get_dataset(self, dataset_id: str) -> dict[str, Any] | None:
        """The dataset's info, or None if the server does not have it."""
        try:
            return self.request("GET", f"/datasets/{dataset_id}")
        except ServerError as exc:
            if exc.status == 404:
                return None
            raise

    def upload_dataset(self, records: list[Any], dataset_id: str | None = None, name: str | None = None) -> dict[str, Any]:
        """Upload tasks; returns the dataset info (id included)."""
        return self.request("POST", "/datasets", json={"records": records, "dataset_id": dataset_id, "name": name})

    def attach(self, dataset_id: str) -> dict[str, Any]:
        """Announce that this client serves rollouts of ``dataset_id``."""
        return self.request("POST", f"/datasets/{dataset_id}/attach")


def _detail(data: bytes) -> str:
    try:
        body = jsonlib.loads(data)
    except ValueError:
        return data[:500].decode(errors="replace")
    if isinstance(body, dict):
        if "detail" in body:
            return str(body["detail"])
        if isinstance(body.get("error"), dict):
            return str(body["error"].get("message"))
    return str(body)[:500]
