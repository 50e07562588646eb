"""A worker's memory over hundreds of rollouts whose agent leaves garbage in reference cycles (issue 36 item 11):
the worker collects it between rollouts, instead of leaving it to Python's rare full collections."""

from __future__ import annotations

from pathlib import Path

import fault_agents

from agentlightning.client import start_workers
from agentlightning.server import LightningServer
from agentlightning.testing import MockLLMServer

MEASURED = 200
GROWTH_BOUND_MB = 30.0  # without the worker's collections: +57 MB over the 200 rollouts; with them: +5 MB


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def test_a_worker_reclaims_its_agents_cyclic_garbage(tmp_path: Path) -> None:
    with (
        MockLLMServer() as mock,
        LightningServer(tmp_path / "s.db", upstream_url=mock.base_url, model_name="mock-model") as server,
    ):
        pool = start_workers(fault_agents.cycle_agent, server.url, nworkers=1, spool_dir=str(tmp_path / "spool"))
        try:
            warm = 2 * fault_agents.KEPT_ROLLOUTS  # the agent's kept cycles all held, the worker's imports done
            server.wait(server.enqueue([{"question": f"w{i}"} for i in range(warm)]), timeout=120)
            [pid] = pool.pids
            before = _rss_mb(pid)
            rollouts = server.wait(server.enqueue([{"question": f"q{i}"} for i in range(MEASURED)]), timeout=120)
            after = _rss_mb(pid)
        finally:
            server.request_stop()
            pool.wait(20)
            pool.stop()
    assert {r.status for r in rollouts} == {"succeeded"}
    assert after - before < GROWTH_BOUND_MB, f"worker RSS {before:.1f} -> {after:.1f} MB over {MEASURED} rollouts"
