"""Fixtures of the dashboard tests: a real Lightning Server whose rollouts were run by real worker processes (a
LangChain tool agent against the mock model), its metrics file, and headless Chromium driven by selenium."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import chromium
import dash_agents
import pytest

from agentlightning.client import start_workers
from agentlightning.server import LightningServer, Settings
from agentlightning.testing import MockLLMServer

TOKEN = "dash-secret"
RUN_WARNING = "upstream answered 500 for rollout r-1 (retrying in 1.0 s): model overloaded"


@dataclass
class Run:
    server: LightningServer
    run_dir: Path
    ok: list[str]
    crashed: list[str]
    flaky: list[str]

    def url(self, hash_path: str = "#/run") -> str:
        return f"{self.server.url}/ui/{hash_path}"


TYPO_WARNING = "roles ['checkr'] matched no LLM call; roles seen: ['checker', 'solver']"


def write_metrics(path: Path, steps: range) -> None:
    """Append per-step rows as the trainer's MetricsWriter writes them for a synchronous run of two roles, one
    of them trained, whose role list has a typo from step 2 on."""
    from agentlightning.trainers.reporting import MetricsWriter

    writer = MetricsWriter(path.parent)
    for step in steps:
        writer.write(
            {
                "step": step,
                "model_version": f"v{step}",
                "reward": 0.1 * step,
                "accuracy": 0.05 * step,
                "train/kl": 0.01 * step,
                "rollouts": 8.0,
                "step_seconds": 2.0,
                "llm_calls": 16.0,
                "calls_on_version": 16.0 - step % 2,
                "async/queue_depth": 0.0,
                "async/staleness_max": 0.0,
                "role/solver/reward": 0.1 * step,
                "role/checker/reward": 0.3 - 0.05 * step,
                "role/solver/transitions": 8.0,
                "role/checker/transitions": 0.0,
                "warnings": [TYPO_WARNING] if step >= 2 else [],
            }
        )
    writer.close()


def write_run_warning(run_dir: Path, message: str, times: int) -> None:
    """Log ``message`` ``times`` times as a warning while the trainer's WarningLog records the run's warnings."""
    from agentlightning.trainers.reporting import WarningLog

    handler = WarningLog(run_dir)
    logger = logging.getLogger("agentlightning.server._proxy")
    logger.addHandler(handler)
    try:
        for _ in range(times):
            logger.warning(message)
    finally:
        logger.removeHandler(handler)


@pytest.fixture(scope="package")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """A token-protected server holding 21 finished rollouts over two model versions: 16 succeeded (4 tasks x 4),
    1 crashed on both attempts, 4 crashed once then succeeded; plus 3 steps of metrics beside its store."""
    run_dir = tmp_path_factory.mktemp("run")
    settings = Settings(lease_seconds=10.0, rollout_timeout=60.0, max_attempts=2)
    with (
        MockLLMServer(handler=dash_agents.tool_rule, token_ids=True) as mock,
        LightningServer(
            run_dir / "store.db",
            upstream_url=mock.base_url,
            model_name="mock-model",
            model_version="v1",
            token=TOKEN,
            settings=settings,
        ) as server,
    ):
        ok = server.enqueue(
            [{"id": f"t{i}", "question": f"q{i}", "mode": "ok", "score": i / 3} for i in range(2)],
            group_size=4,
            group_id="step1",
        )
        crashed = server.enqueue([{"id": "bad", "question": "qbad", "mode": "crash", "score": 0}], group_id="step1")
        pool = start_workers(
            dash_agents.tool_agent, server.url, nworkers=1, token=TOKEN, spool_dir=str(run_dir / "spool")
        )
        try:
            server.wait(ok + crashed, timeout=120)
            server.set_upstream(mock.base_url, "mock-model", "v2")
            ok += server.enqueue(
                [{"id": f"t{i}", "question": f"q{i}", "mode": "ok", "score": i / 3} for i in range(2, 4)],
                group_size=4,
                group_id="step2",
            )
            flaky = server.enqueue(
                [{"id": "flaky", "question": "qflaky", "mode": "flaky", "score": 1}], group_size=4, group_id="step2"
            )
            server.wait(ok + flaky, timeout=120)
        finally:
            server.request_stop()
            pool.wait(20)
        write_metrics(run_dir / "metrics.jsonl", range(1, 4))
        write_run_warning(run_dir, RUN_WARNING, times=2)
        yield Run(server, run_dir, ok, crashed, flaky)


@pytest.fixture(scope="package")
def browser() -> Iterator[object]:
    """Headless Chromium; skipped with how to install it when missing, failed instead when AGL_REQUIRE_BROWSER=1."""
    reason = chromium.missing()
    if reason is not None:
        if os.environ.get("AGL_REQUIRE_BROWSER") == "1":
            pytest.fail(f"AGL_REQUIRE_BROWSER=1 but {reason}")
        pytest.skip(f"browser tests need headless Chromium: {reason}")
    session = chromium.start()
    try:
        yield session
    finally:
        session.quit()
