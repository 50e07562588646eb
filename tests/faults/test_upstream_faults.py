"""The model server goes away (connection refused), answers 500s or 429s, or is paused for a weight update, while
real worker processes run rollouts through the proxy. Issue 21, defect 2."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import fault_agents
import httpx
import pytest
from _harness import FaultyUpstream
from polling import wait_for

from agentlightning.client import start_workers
from agentlightning.server import LightningServer, Settings


@pytest.fixture
def upstream() -> Iterator[FaultyUpstream]:
    faulty = FaultyUpstream()
    yield faulty
    faulty.stop()


def test_an_outage_shorter_than_the_retry_window_fails_nothing(tmp_path: Path, upstream: FaultyUpstream) -> None:
    """6 s of connection refused, then 2 s of HTTP 500, then 429s: every rollout succeeds on its first attempt (the
    issue saw 8 s fail rollouts for good; the window here is 30 s, the default 120 s)."""
    settings = Settings(lease_seconds=5.0, max_attempts=3, upstream_retry_window=30.0, retry_backoff_max=1.0)
    with LightningServer(
        tmp_path / "s.db", upstream_url=upstream.base_url, model_name="mock-model", settings=settings
    ) as server:
        pool = start_workers(fault_agents.fault_agent, server.url, nworkers=2, spool_dir=str(tmp_path / "spool"))
        try:
            ids = server.enqueue([{"id": f"t{i}", "question": f"q{i}", "calls": 3} for i in range(16)])
            wait_for(lambda: len(server.store.finished(ids)) >= 4, 60, "a few rollouts to finish")
            upstream.refuse_for(6.0).join()
            wait_for(
                lambda: len(upstream.arrivals) > 0 and upstream.arrivals[-1][0] > time.monotonic() - 1,
                10,
                "traffic to resume",
            )
            upstream.status = 500
            time.sleep(2.0)
            upstream.status, upstream.retry_after = 429, "1"
            time.sleep(1.0)
            upstream.status = None
            rollouts = server.wait(ids, timeout=120)
            tries = [call.metadata["upstream_tries"] for rid in ids for call in server.store.proxy_calls(rid)]
        finally:
            server.request_stop()
            pool.wait(20)
            pool.stop()
    assert [(r.status, r.attempt) for r in rollouts] == [("succeeded", 1)] * 16
    assert all(len(r.llm_calls) == 3 and r.llm_calls[-1].token_source == "server" for r in rollouts)
    assert {status for _, status in upstream.arrivals} >= {200, 429, 500}
    assert len(tries) == 48 and max(tries) > 4  # held through the outage, not failed after a fixed count of tries


def test_retry_after_is_honoured(tmp_path: Path, upstream: FaultyUpstream) -> None:
    settings = Settings(retry_backoff=0.05, upstream_retry_window=30.0)
    with LightningServer(
        tmp_path / "s.db", upstream_url=upstream.base_url, model_name="mock-model", settings=settings
    ) as server:
        [rid] = server.enqueue([{"question": "q"}])
        lease = server.store.dequeue("w", 30.0)
        upstream.status, upstream.retry_after = 429, "2"
        answer: list[httpx.Response] = []
        request = threading.Thread(
            target=lambda: answer.append(
                httpx.post(
                    f"{server.url}/rollouts/{rid}/v1/chat/completions",
                    timeout=30,
                    json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                )
            )
        )
        request.start()
        wait_for(lambda: upstream.arrivals, 10, "the first try")
        time.sleep(0.5)
        upstream.status = None
        request.join(30)
        (first, _), (second, status) = upstream.arrivals
        assert answer[0].status_code == 200 and status == 200 and lease is not None
        assert second - first >= 1.9  # what the upstream asked for, not the 0.05 s backoff


def test_a_paused_upstream_holds_requests_instead_of_failing_them(tmp_path: Path, upstream: FaultyUpstream) -> None:
    with LightningServer(tmp_path / "s.db", upstream_url=upstream.base_url, model_name="mock-model") as server:
        pool = start_workers(fault_agents.fault_agent, server.url, nworkers=2, spool_dir=str(tmp_path / "spool"))
        try:
            with server.upstream_paused():  # e.g. while the trainer loads new weights into the model server
                ids = server.enqueue([{"question": f"p{i}", "calls": 2} for i in range(4)])
                wait_for(lambda: len(server.store.list_rollouts(status="running")) == 2, 60, "rollouts to start")
                time.sleep(1.5)
                assert upstream.arrivals == [] and server.store.finished(ids) == set()
            rollouts = server.wait(ids, timeout=60)
        finally:
            server.request_stop()
            pool.wait(20)
            pool.stop()
    assert [(r.status, r.attempt) for r in rollouts] == [("succeeded", 1)] * 4
