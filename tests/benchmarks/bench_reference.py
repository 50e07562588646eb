"""Benchmark: our Lightning Server against the reference project's store (``agentlightning==0.3.0``), same workload.

Both halves share one mock upstream (``MockLLMServer``, in its own process) and the workload of ``bench_server.py``:
R rollouts enqueued at once, N worker processes, K=6 chat calls per rollout with the conversation so far and the
token ids recorded, a reward per rollout, timed from the enqueue until every rollout is stored.

- Ours: ``agl server`` (SQLite store on disk, calls through the per-rollout proxy) with ``start_workers``, measured
  by ``bench_server.measure_throughput``.
- Reference: 0.3.0's in-memory store behind its client-server HTTP API, driven by ``reference_store_driver.py`` run
  with the reference venv's Python (``.venv-ref``, made by ``make bench-reference-venv``): 0.3.0's own
  ``LitAgentRunner`` + ``OtelTracer`` workers, each call an OTel span exported to the store; the calls go to the
  upstream directly (no proxy hop, in 0.3.0's favour; details in that file).

Prints both rates and their ratio, and CPU milliseconds per rollout of each part (the steadier figure on a loaded
machine) and their ratio. Without ``.venv-ref`` it measures ours
only and says how to create it. Run with either of:

    python tests/benchmarks/bench_reference.py [--workers 4] [--rollouts 200] [--calls 6] [--repeat 1]
    python -m pytest -q -s tests/benchmarks/bench_reference.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from bench_server import CALLS, MOCK_SCRIPT, _free_port, _wait_healthy, measure_throughput

ROOT = Path(__file__).resolve().parents[2]
REFERENCE_PYTHON = ROOT / ".venv-ref" / "bin" / "python"
DRIVER = Path(__file__).with_name("reference_store_driver.py")
CREATE_HINT = (
    "make bench-reference-venv   (a venv with agentlightning==0.3.0 and OpenTelemetry 1.44.0, "
    "see the Makefile; ~800 MB, no torch)"
)


def measure_ours(mock_url: str, mock_pid: int, workers: int, rollouts: int, calls: int) -> dict[str, Any]:
    """Rollouts/s of a fresh ``agl server`` (SQLite store in a temporary folder) fed by ``workers`` processes."""
    env = {**os.environ, "PYTHONPATH": f"{Path(__file__).parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    port = _free_port()
    server_url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="agl-bench-ref-") as tmp:
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agentlightning._cli",
                "server",
                "--port",
                str(port),
                "--store",
                f"{tmp}/bench.db",
                "--upstream",
                mock_url,
                "--model-name",
                "mock-model",
                "--log-level",
                "WARNING",
            ],
            env=env,
        )
        try:
            _wait_healthy(server_url)
            rate, failed, cpu_ms = measure_throughput(server_url, workers, rollouts, calls, server.pid, mock_pid)
        finally:
            server.terminate()
            server.wait(20)
    return {"rollouts_per_s": rate, "failed": failed, "cpu_ms": cpu_ms}


def measure_reference(mock_url: str, mock_pid: int, workers: int, rollouts: int, calls: int) -> dict[str, Any]:
    """Run ``reference_store_driver.py`` under the reference venv and return its JSON figures."""
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    command = [
        str(REFERENCE_PYTHON),
        str(DRIVER),
        "--upstream",
        mock_url,
        "--upstream-pid",
        str(mock_pid),
        "--workers",
        str(workers),
        "--rollouts",
        str(rollouts),
        "--calls",
        str(calls),
    ]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        raise RuntimeError(
            f"reference driver failed (exit {result.returncode}): {' '.join(command)}\n{result.stderr[-3000:]}"
        )
    return json.loads(lines[-1])


def _cpu_line(cpu: dict[str, float]) -> str:
    parts = " | ".join(f"{name} {value:.1f}" for name, value in cpu.items())
    return f"{parts} | total {sum(cpu.values()):.1f}"


def run(workers: int = 4, rollouts: int = 200, calls: int = CALLS, repeat: int = 1) -> list[dict[str, Any]]:
    """Measure ours and the reference ``repeat`` times each (alternating) against one mock upstream; print both."""
    have_reference = REFERENCE_PYTHON.exists()
    mock = subprocess.Popen(
        [sys.executable, "-c", MOCK_SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    mock_url = mock.stdout.readline().strip()  # type: ignore[union-attr]
    rounds: list[dict[str, Any]] = []
    try:
        for _ in range(repeat):
            figures: dict[str, Any] = {"ours": measure_ours(mock_url, mock.pid, workers, rollouts, calls)}
            if have_reference:
                figures["reference"] = measure_reference(mock_url, mock.pid, workers, rollouts, calls)
            rounds.append(figures)
    finally:
        mock.stdin.close()  # type: ignore[union-attr]
        mock.wait(20)
    print(
        f"\nOurs vs agentlightning==0.3.0 ({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}): "
        f"{workers} workers, {rollouts} rollouts x {calls} LLM calls, same mock upstream"
    )
    for index, figures in enumerate(rounds, 1):
        ours = figures["ours"]
        print(
            f"  round {index}: ours (agl server, SQLite, via proxy) {ours['rollouts_per_s']:.1f} rollouts/s, "
            f"failed {ours['failed']}"
        )
        print(f"           CPU ms/rollout: {_cpu_line(ours['cpu_ms'])}")
        reference = figures.get("reference")
        if reference is None:
            continue
        print(
            f"           0.3.0 (in-memory store over HTTP, direct calls) {reference['rollouts_per_s']:.1f} "
            f"rollouts/s, failed {reference['failed']} | ratio ours/0.3.0 "
            f"{ours['rollouts_per_s'] / reference['rollouts_per_s']:.2f}x"
        )
        print(
            f"           CPU ms/rollout: {_cpu_line(reference['cpu_ms'])} | ratio 0.3.0/ours "
            f"{sum(reference['cpu_ms'].values()) / sum(ours['cpu_ms'].values()):.2f}x"
        )
    if not have_reference:
        print(f"  reference half skipped: {REFERENCE_PYTHON} not found; create it with\n    {CREATE_HINT}")
    elif len(rounds) > 1:  # each round's two halves ran minutes apart: the median is the steadier comparison
        rates = [f["ours"]["rollouts_per_s"] / f["reference"]["rollouts_per_s"] for f in rounds]
        cpu = [sum(f["reference"]["cpu_ms"].values()) / sum(f["ours"]["cpu_ms"].values()) for f in rounds]
        print(
            f"  median of {len(rounds)} rounds: ours/0.3.0 rollouts/s {statistics.median(rates):.2f}x "
            f"(min {min(rates):.2f}x) | 0.3.0/ours CPU per rollout {statistics.median(cpu):.2f}x (min {min(cpu):.2f}x)"
        )
    return rounds


def test_bench_reference() -> None:
    rounds = run()
    assert all(figures["ours"]["failed"] == 0 for figures in rounds)
    if not REFERENCE_PYTHON.exists():
        pytest.skip(f"reference half skipped: no {REFERENCE_PYTHON}; create it with {CREATE_HINT}")
    for figures in rounds:
        reference = figures["reference"]
        assert reference["failed"] == 0
        assert reference["sample_triplets_with_token_ids"] == CALLS and reference["sample_final_reward"] == 1.0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rollouts", type=int, default=200)
    parser.add_argument("--calls", type=int, default=CALLS)
    parser.add_argument("--repeat", type=int, default=1)
    options = parser.parse_args()
    run(options.workers, options.rollouts, options.calls, options.repeat)
