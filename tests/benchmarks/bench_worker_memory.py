"""Benchmark: a worker process's memory over many one-call rollouts, as a user gets it (nothing collected or trimmed
from outside).

One worker (``start_workers``, the worker process ``agl client`` runs) serves ``worker_memory_agent:readme_agent``
(the README's agent: a fresh ``openai.OpenAI`` client per rollout, one chat call) from a Lightning Server (SQLite
store on disk) in front of a ``MockLLMServer``, both in this process. Rollouts are enqueued in batches of
``--every``; after each batch is stored, the worker's RSS (``/proc/<pid>/status``) is sampled. Prints one row per
sample: rollouts done, worker RSS, its growth since the first sample, and the batch's rollouts/s. Linux only.

    python tests/benchmarks/bench_worker_memory.py                    # 2,000 rollouts, a sample every 100
    python tests/benchmarks/bench_worker_memory.py --rollouts 1000 --probe /tmp/probe.jsonl

``--probe FILE`` has the worker write what it holds every 250 rollouts (see ``worker_memory_agent.py``); its
collections change the RSS figures, so measure RSS without it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import worker_memory_agent  # noqa: E402 - found through the line above

from agentlightning.client import start_workers  # noqa: E402
from agentlightning.server import LightningServer  # noqa: E402
from agentlightning.testing import MockLLMServer  # noqa: E402


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def measure(rollouts: int, every: int) -> list[tuple[int, float, float]]:
    """(rollouts done, worker RSS in MB, rollouts/s of the batch) after each batch of ``every``."""
    samples: list[tuple[int, float, float]] = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        MockLLMServer() as mock,
        LightningServer(Path(tmp) / "store.db", upstream_url=mock.base_url, model_name="mock-model") as server,
    ):
        pool = start_workers(
            worker_memory_agent.readme_agent,
            server.url,
            nworkers=1,
            spool_dir=str(Path(tmp) / "spool"),
            log_level=logging.WARNING,
        )
        try:
            for done in range(every, rollouts + 1, every):
                began = time.perf_counter()
                ids = server.enqueue([{"question": f"q{i}"} for i in range(done - every, done)])
                finished = server.wait(ids, timeout=600)
                elapsed = time.perf_counter() - began
                failed = [r.rollout_id for r in finished if r.status != "succeeded"]
                assert not failed, f"rollouts did not succeed: {failed[:3]}"
                [pid] = pool.pids
                samples.append((done, _rss_mb(pid), every / elapsed))
        finally:
            server.request_stop()
            pool.wait(30)
            pool.stop()
    return samples


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--every", type=int, default=100, help="rollouts between RSS samples")
    parser.add_argument("--probe", help="the worker appends what it holds to this file (JSON lines)")
    args = parser.parse_args(argv)
    if args.probe:
        os.environ["AGL_BENCH_PROBE"] = args.probe  # read by the spawned worker when it imports the agent
    logging.basicConfig(level=logging.WARNING)
    samples = measure(args.rollouts, args.every)
    first = samples[0][1]
    print(f"\none worker, {args.rollouts} one-call rollouts; load average {os.getloadavg()[0]:.1f}")
    print("rollouts | worker RSS MB | since first | rollouts/s")
    for done, rss, rate in samples:
        print(f"{done:8d} | {rss:13.1f} | {rss - first:+11.1f} | {rate:10.1f}")
    rss = [s[1] for s in samples]
    print(f"min {min(rss):.1f} MB, max {max(rss):.1f} MB, last {rss[-1]:.1f} MB")
    return 0


def test_bench_worker_memory() -> None:
    """The benchmark at a small size (``pytest -s tests/benchmarks/bench_worker_memory.py``)."""
    assert main(["--rollouts", "300"]) == 0


if __name__ == "__main__":
    sys.exit(main())
