"""Benchmark: Lightning Server throughput end to end, and the proxy's added latency per LLM call.

Processes: the mock upstream (``MockLLMServer``) and the server (``agl server``, SQLite store on disk) each run in
their own process; N worker processes (``start_workers``) run an agent making K=6 chat calls per rollout with the
real ``openai`` client through the rollout's proxy URL, and report results.

The agent calls through the real ``openai`` client (captured client-side, joined with the proxy's records);
``--agent-client httpx`` makes it call with plain httpx (about 1 ms of CPU a call here, where the openai client alone
costs several), so that the figures measure more of the Lightning path than of the agent's HTTP stack.

1. Proxy latency: sequential chat calls straight to the mock vs through the proxy of a running rollout,
   interleaved so that machine load hits both alike; reports the medians and the added median latency.
2. Throughput: R rollouts enqueued at once, timed from enqueue until all are stored (with calls joined).
   Baseline in the same run: the same agent code in N plain processes calling the mock directly (no server, no
   proxy, no store); the ratio says what the disaggregated path keeps of it.

Targets (2-core machine): >= 150 rollouts/s with 6 calls each, < 2 ms added per proxied call at the median.
Run with either of:

    python tests/benchmarks/bench_server.py [--workers 4] [--rollouts 600] [--calls 6]
    python -m pytest -q -s tests/benchmarks/bench_server.py
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import openai

import agentlightning as agl

CALLS = 6
_HTTP: dict[str, httpx.Client] = {}

MOCK_SCRIPT = """
import sys
from agentlightning.testing import MockLLMServer
with MockLLMServer() as server:
    print(server.base_url, flush=True)
    sys.stdin.read()
"""


def _http() -> httpx.Client:
    http = _HTTP.get("http")
    if http is None:  # one pooled connection set per process, like a long-running agent service
        http = _HTTP["http"] = httpx.Client(limits=httpx.Limits(max_keepalive_connections=8), timeout=60)
    return http


def _chat(client: str, llm: agl.LLM, messages: list[dict[str, Any]], sdk: openai.OpenAI | None) -> str:
    """One chat call with the agent's HTTP client of choice; returns the answer's text."""
    if sdk is not None:
        reply = sdk.chat.completions.create(model=llm.model, messages=messages, max_tokens=16)  # type: ignore[arg-type]
        return reply.choices[0].message.content or ""
    payload = {"model": llm.model, "messages": messages, "max_tokens": 16}
    response = _http().post(
        f"{llm.base_url}/chat/completions", json=payload, headers={"authorization": f"Bearer {llm.api_key}"}
    )
    response.raise_for_status()
    return response.json()["choices"][0]["message"]["content"] or ""


def run_agent(task: dict, llm: agl.LLM) -> float:
    """K chat calls, each with the conversation so far; reward 1 if every answer echoed its question.

    ``task["client"]`` is the agent's HTTP client: the real ``openai`` client or plain httpx."""
    client = task.get("client", "openai")
    sdk = (
        openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, http_client=_http(), max_retries=0)
        if client == "openai"
        else None
    )
    messages: list[dict[str, Any]] = []
    good = 0
    for turn in range(task["calls"]):
        question = f"{task['question']} turn {turn}"
        messages.append({"role": "user", "content": question})
        answer = _chat(client, llm, messages, sdk)
        messages.append({"role": "assistant", "content": answer})
        good += question in answer
    return good / task["calls"]


bench_agent = agl.rollout(run_agent)


def _direct_worker(args: tuple[str, list[dict]]) -> int:  # a spawn Pool target
    base_url, tasks = args
    llm = agl.LLM(base_url=base_url, model="mock-model")
    for task in tasks:
        run_agent(task, llm)
    return len(tasks)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_healthy(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.05)
    raise RuntimeError(f"server at {url} did not start")


def measure_latency(http: httpx.Client, mock_url: str, server_url: str, samples: int) -> tuple[float, float]:
    """Median seconds of a chat call direct vs proxied (interleaved)."""
    [rid] = http.post(f"{server_url}/rollouts", json={"tasks": [{"q": "latency"}], "timeout": 3600}).json()[
        "rollout_ids"
    ]
    lease = http.post(f"{server_url}/workers/bench-latency/dequeue").json()["lease"]
    assert lease["rollout_id"] == rid
    body = {
        "model": "mock-model",
        "messages": [{"role": "user", "content": "how long does this take?"}],
        "max_tokens": 16,
        "return_token_ids": True,
    }
    direct_url = f"{mock_url}/chat/completions"
    proxy_url = f"{server_url}/rollouts/{rid}/v1/chat/completions"
    direct: list[float] = []
    proxied: list[float] = []
    for index in range(samples + 20):
        for url, sink in ((direct_url, direct), (proxy_url, proxied)):
            start = time.perf_counter()
            response = http.post(url, json=body)
            elapsed = time.perf_counter() - start
            assert response.status_code == 200, response.text
            if index >= 20:  # warm-up
                sink.append(elapsed)
        if index % 50 == 0:  # keep the lease alive
            http.post(f"{server_url}/rollouts/{rid}/heartbeat", json={"attempt": 1, "worker_id": "bench-latency"})
    http.post(f"{server_url}/rollouts/{rid}/cancel")
    return statistics.median(direct), statistics.median(proxied)


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds used so far by the processes ``pids`` (Linux /proc)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def measure_throughput(
    server_url: str, workers: int, rollouts: int, calls: int, server_pid: int, mock_pid: int, client: str = "openai"
) -> tuple[float, int, dict[str, float]]:
    """Rollouts per second through the server with ``workers`` worker processes, failures, and CPU milliseconds
    per rollout spent by the server, the workers and the upstream."""
    from agentlightning.client import start_workers

    http = httpx.Client(timeout=60)
    spool = tempfile.mkdtemp(prefix="agl-bench-spool-")
    pool = start_workers(bench_agent, server_url, nworkers=workers, spool_dir=spool, log_level=30)
    try:
        warm = [{"question": f"warm {i}", "calls": calls, "client": client} for i in range(workers * 4)]
        _run_batch(http, server_url, warm)
        tasks = [{"question": f"question {i}", "calls": calls, "client": client} for i in range(rollouts)]
        groups = {"server": [server_pid], "workers": pool.pids, "upstream": [mock_pid]}
        before = {name: cpu_seconds(pids) for name, pids in groups.items()}
        start = time.perf_counter()
        rows = _run_batch(http, server_url, tasks)
        elapsed = time.perf_counter() - start
        cpu_ms = {name: (cpu_seconds(pids) - before[name]) * 1000 / rollouts for name, pids in groups.items()}
    finally:
        http.post(f"{server_url}/stop")
        pool.wait(30)
        pool.stop(5)
    failed = sum(1 for row in rows if row["status"] != "succeeded" or row["n_calls"] != calls)
    return rollouts / elapsed, failed, cpu_ms


def _run_batch(http: httpx.Client, server_url: str, tasks: list[dict]) -> list[dict]:
    group = f"bench-{time.monotonic_ns()}"
    ids = http.post(f"{server_url}/rollouts", json={"tasks": tasks, "group_id": group}).json()["rollout_ids"]
    while True:
        done = http.get(f"{server_url}/stats").json()["rollouts"]
        left = done.get("queued", 0) + done.get("running", 0)
        if not left:
            break
        # Poll rarely while much is left (each poll costs the server and this process CPU that the measured path
        # could use), every 10 ms near the end.
        time.sleep(min(0.2, max(0.01, left / 2000)))
    rows = http.get(f"{server_url}/rollouts", params={"limit": len(ids) + 10}).json()
    wanted = set(ids)
    return [row for row in rows if row["rollout_id"] in wanted]


def measure_direct(
    mock_url: str, workers: int, rollouts: int, calls: int, mock_pid: int, client: str = "openai"
) -> tuple[float, dict[str, float]]:
    """Rollouts per second of the same agent code calling the mock directly from ``workers`` processes, and the
    CPU milliseconds per rollout of those processes and of the upstream."""
    tasks = [{"question": f"question {i}", "calls": calls, "client": client} for i in range(rollouts)]
    chunks = [(mock_url, tasks[i::workers]) for i in range(workers)]
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        pool.map(_direct_worker, [(mock_url, [{"question": "warm", "calls": calls, "client": client}] * 4)] * workers)
        pids = [process.pid for process in pool._pool]  # type: ignore[attr-defined]
        before = {"workers": cpu_seconds(pids), "upstream": cpu_seconds([mock_pid])}
        start = time.perf_counter()
        assert sum(pool.map(_direct_worker, chunks)) == rollouts
        rate = rollouts / (time.perf_counter() - start)
        cpu_ms = {
            "workers": (cpu_seconds(pids) - before["workers"]) * 1000 / rollouts,
            "upstream": (cpu_seconds([mock_pid]) - before["upstream"]) * 1000 / rollouts,
        }
        return rate, cpu_ms


def run(
    workers: int = 4, rollouts: int = 600, calls: int = CALLS, samples: int = 300, client: str = "openai"
) -> dict[str, float]:
    """Run both measurements and print a report; returns the figures."""
    env = {**os.environ, "PYTHONPATH": f"{Path(__file__).parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    mock = subprocess.Popen(
        [sys.executable, "-c", MOCK_SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    mock_url = mock.stdout.readline().strip()  # type: ignore[union-attr]
    port = _free_port()
    server_url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="agl-bench-") as tmp:
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
            with httpx.Client(timeout=30) as http:
                direct_s, proxied_s = measure_latency(http, mock_url, server_url, samples)
            direct_rate, direct_cpu = measure_direct(mock_url, workers, rollouts, calls, mock.pid, client)
            rate, failed, cpu = measure_throughput(server_url, workers, rollouts, calls, server.pid, mock.pid, client)
        finally:
            server.terminate()
            server.wait(20)
            mock.stdin.close()  # type: ignore[union-attr]
            mock.wait(20)
    added_ms = (proxied_s - direct_s) * 1000
    print(
        f"\nLightning Server benchmark ({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}): "
        f"{workers} workers, {rollouts} rollouts x {calls} LLM calls, agent calls via {client}"
    )
    print(
        f"  proxy latency  direct median {direct_s * 1000:.2f} ms | proxied median {proxied_s * 1000:.2f} ms | "
        f"added {added_ms:.2f} ms (target < 2 ms) | ratio proxied/direct {proxied_s / direct_s:.2f}x"
    )
    print(
        f"  throughput     through server {rate:.1f} rollouts/s = {rate * calls:.0f} proxied calls/s "
        f"(target >= 150 rollouts/s) | direct to upstream {direct_rate:.1f} rollouts/s | "
        f"ratio server/direct {rate / direct_rate:.2f}x | failed {failed}"
    )
    print(
        f"  CPU ms/rollout through server: server {cpu['server']:.1f} | workers {cpu['workers']:.1f} | upstream "
        f"{cpu['upstream']:.1f} || direct: workers {direct_cpu['workers']:.1f} | upstream {direct_cpu['upstream']:.1f}"
    )
    total = sum(cpu.values())
    print(
        f"  => at {os.cpu_count()} idle cores the server path would sustain ~{os.cpu_count() * 1000 / total:.0f} "
        f"rollouts/s (CPU-bound estimate), the server process alone ~{1000 / cpu['server']:.0f} rollouts/s"
    )
    return {
        "added_ms": added_ms,
        "rollouts_per_s": rate,
        "direct_rollouts_per_s": direct_rate,
        "failed": failed,
        **{f"cpu_ms_{name}": value for name, value in cpu.items()},
    }


def test_bench_server() -> None:
    figures = run()
    assert figures["failed"] == 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rollouts", type=int, default=600)
    parser.add_argument("--calls", type=int, default=CALLS)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument(
        "--agent-client",
        choices=("openai", "httpx"),
        default="openai",
        help="the agent's HTTP client: the openai SDK (several ms of CPU a call) or plain httpx (~1 ms)",
    )
    options = parser.parse_args()
    run(options.workers, options.rollouts, options.calls, options.samples, options.agent_client)
