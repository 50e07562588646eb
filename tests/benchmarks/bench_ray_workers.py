"""Benchmark: rollouts/s through Ray workers (``agl.RayWorkers``) vs local worker processes (``start_workers``), same
workload, one run.

Both sides serve the same agent (``tests/ray/ray_agents.py:chat_agent``: one chat call through the rollout's proxy
URL with the real ``openai`` client) from a fresh Lightning Server (SQLite store on disk) in front of the mock
upstream, with N workers each. Each side first runs N rollouts to warm up (imports, connections), then R rollouts
are enqueued at once and timed until all are stored. The local side runs before and after the Ray side (their mean
is the baseline), so that drifting machine load hits both alike. The Ray side runs on a new local cluster of N CPUs
(this machine only), so the ratio is what Ray's actors cost here next to plain processes; start-up times are
printed too.

    python tests/benchmarks/bench_ray_workers.py [--workers 2] [--rollouts 200]
    python -m pytest -q -s tests/benchmarks/bench_ray_workers.py
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

AGENTS = Path(__file__).resolve().parents[1] / "ray"
sys.path.insert(0, str(AGENTS))

import ray_agents  # noqa: E402 - found through the line above

import agentlightning as agl  # noqa: E402
from agentlightning.client import start_workers  # noqa: E402
from agentlightning.server import LightningServer, Settings  # noqa: E402
from agentlightning.testing import MockLLMServer  # noqa: E402


def _measure(
    directory: Path, upstream: str, workers: int, rollouts: int, start: Callable[[str], Any]
) -> tuple[float, float]:
    """(seconds from start to the first N rollouts done, rollouts/s of the timed batch)."""
    with LightningServer(
        directory / "store.db", upstream_url=upstream, model_name="mock-model", settings=Settings(rollout_timeout=120.0)
    ) as server:
        began = time.perf_counter()
        pool = start(server.url)
        try:
            warm = server.wait(server.enqueue([{"question": f"warm {i}"} for i in range(workers)]), timeout=300)
            started = time.perf_counter() - began
            began = time.perf_counter()
            done = server.wait(server.enqueue([{"question": f"q{i}"} for i in range(rollouts)]), timeout=600)
            elapsed = time.perf_counter() - began
        finally:
            server.request_stop()
            pool.wait(30)
            pool.stop()
    statuses = {r.status for r in warm + done}
    assert statuses == {"succeeded"}, f"rollouts ended {statuses}"
    return started, rollouts / elapsed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rollouts", type=int, default=200)
    args = parser.parse_args(argv)
    import ray

    logging.basicConfig(level=logging.WARNING)
    quiet = {"log_level": logging.WARNING}
    with tempfile.TemporaryDirectory() as tmp, MockLLMServer() as mock:
        base = Path(tmp)
        for name in ("local-1", "ray", "local-2"):
            (base / name).mkdir()

        def run_local(name: str) -> tuple[float, float]:
            return _measure(
                base / name,
                mock.base_url,
                args.workers,
                args.rollouts,
                lambda url: start_workers(ray_agents.chat_agent, url, args.workers, **quiet),
            )

        before = run_local("local-1")
        began = time.perf_counter()
        ray.init(
            address="local",
            num_cpus=args.workers,
            include_dashboard=False,
            logging_level=logging.WARNING,
            runtime_env={"working_dir": str(AGENTS)},
        )
        cluster = time.perf_counter() - began
        try:
            on_ray = _measure(
                base / "ray",
                mock.base_url,
                args.workers,
                args.rollouts,
                lambda url: agl.RayWorkers(num_workers=args.workers).start(ray_agents.chat_agent, url, **quiet),
            )
        finally:
            ray.shutdown()
        after = run_local("local-2")
    local = ((before[0] + after[0]) / 2, (before[1] + after[1]) / 2)
    print(f"\n{args.rollouts} rollouts (1 chat call each), {args.workers} workers")
    print(
        f"local worker processes: {local[1]:7.1f} rollouts/s  (before and after Ray: {before[1]:.1f}, "
        f"{after[1]:.1f}; start to first rollouts {local[0]:.1f} s)"
    )
    print(
        f"Ray actors:             {on_ray[1]:7.1f} rollouts/s  (start to first rollouts {on_ray[0]:.1f} s, "
        f"plus {cluster:.1f} s for the local cluster)"
    )
    print(f"Ray / local: {on_ray[1] / local[1]:.2f}x rollouts/s")
    return 0


def test_ray_workers_benchmark() -> None:
    """The benchmark at a small size (``pytest -s tests/benchmarks/bench_ray_workers.py``)."""
    assert main(["--rollouts", "60"]) == 0


if __name__ == "__main__":
    sys.exit(main())
