"""Benchmark: the dashboard on a store of 100k rollouts x 6 calls (4 LLM + 2 tool calls each, 3 roles, 10 model
versions, 2% failed, 5% retried).

The store is made by the real SQLiteStore (datasets, enqueue, model versions) with the finished rollouts' rows,
calls and rewards then written in bulk in its schema (storing 100k results one transaction each would take most of
the benchmark). Reported:

- the JSON queries the pages make (median of 5, milliseconds), against the same queries on a store of 1k rollouts
  (the ratio shows what grows with the store);
- in headless Chromium: first paint of the Rollouts page (navigation to the first 50 rows drawn), and each filter
  (the control changed to the narrowed table drawn), medians of 5. Targets: first paint < 1 s, filter < 300 ms.

Run with either of:

    python tests/benchmarks/bench_dashboard.py
    python -m pytest -q -s tests/benchmarks/bench_dashboard.py
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "dashboard"))

import chromium  # noqa: E402

from agentlightning.protocol import Task  # noqa: E402
from agentlightning.server import LightningServer  # noqa: E402
from agentlightning.server.store import SQLiteStore  # noqa: E402
from agentlightning.types import Call, ErrorInfo, Reward, Rollout  # noqa: E402

ROLES = ("planner", "writer", "checker")
QUERIES = {
    "overview": "/overview",
    "filters": "/filters",
    "batches": "/batches",
    "rollouts page 1": "/rollouts",
    "last page (offset)": "/rollouts?offset={last}",
    "sort by reward": "/rollouts?sort=reward",
    "failed only": "/rollouts?failed=true",
    "status + version + reward": "/rollouts?status=succeeded&model_version=v7&reward_min=0.5",
    "role": "/rollouts?role=checker",
    "task": "/rollouts?task_id=t7",
    "tasks page": "/tasks",
    "tasks by reward": "/tasks?sort=reward",
    "task groups": "/tasks/t7",
    "rollout detail": "/rollouts/{one}",
}


def build_store(path: Path, n_rollouts: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    store = SQLiteStore(path)
    n_tasks = max(1, n_rollouts // 80)
    tasks = [Task(task_id=f"t{i}", payload={"question": f"question {i}?", "id": f"t{i}"}) for i in range(n_tasks)]
    for version in range(1, 11):
        store.set_model_version(f"v{version}", "policy", "http://127.0.0.1:1/v1")
    for step in range(n_rollouts // (n_tasks * 8)):
        store.enqueue(tasks, group_size=8, group_id=f"step{step}")
    db = store._db
    rows = db.execute("SELECT rollout_id, task_id, group_id, task, created FROM rollouts").fetchall()
    versions = [r[0] for r in db.execute("SELECT version FROM model_versions ORDER BY seq")]
    updates, calls, rewards, attempts = [], [], [], []
    for index, (rollout_id, task_id, group_id, task, created) in enumerate(rows):
        version = versions[min(len(versions) - 1, index * len(versions) // len(rows))]
        failed, attempt = rng.random() < 0.02, 2 if rng.random() < 0.05 else 1
        reward = None if failed else round(rng.random(), 3)
        start = created + 1
        seq = []
        for k in range(6):
            tool = k in (1, 3)
            seq.append(
                Call(
                    rollout_id=rollout_id,
                    sequence=k,
                    kind="tool" if tool else "llm",
                    role=ROLES[k % 3],
                    name="search" if tool else "policy",
                    start_time=start + k,
                    end_time=start + k + 0.5,
                    input={"query": "x"} if tool else [{"role": "user", "content": f"step {k} of {task_id}"}],
                    output="result" if tool else {"role": "assistant", "content": f"answer {k}"},
                    prompt_token_ids=None if tool else list(range(40)),
                    completion_token_ids=None if tool else [1] * 12,
                    token_source=None if tool else "server",
                    metadata={"model_version": version},
                )
            )
        calls += [(rollout_id, c.sequence, c.call_id, c.kind, c.role, c.model_dump_json()) for c in seq]
        error = ErrorInfo(type="ValueError", message="bad", traceback="Traceback ...") if failed else None
        final = Reward(value=reward, source="final") if reward is not None else None
        rewards += [(rollout_id, 0, final.value, None, "final", final.model_dump_json())] if final else []
        record = Rollout(
            rollout_id=rollout_id,
            task_id=task_id,
            task=json.loads(task),
            group_id=group_id,
            attempt=attempt,
            status="failed" if failed else "succeeded",
            final_reward=reward,
            error=error,
            model_version=version,
        )
        updates.append(
            (record.status, attempt, start, start + 6, reward, version, record.model_dump_json(), rollout_id)
        )
        attempts += [
            (rollout_id, n, "w1", record.status if n == attempt else "failed", start, start + 6, None, "[]")
            for n in range(1, attempt + 1)
        ]
    with store._lock, store._transaction():
        db.executemany(
            "UPDATE rollouts SET status=?, attempt=?, started=?, ended=?, final_reward=?, model_version=?, "
            "n_calls=6, record=? WHERE rollout_id=?",
            updates,
        )
        db.executemany("INSERT INTO calls VALUES (?, ?, ?, ?, ?, ?)", calls)
        db.executemany("INSERT INTO rewards VALUES (?, ?, ?, ?, ?, ?)", rewards)
        db.executemany(
            "INSERT INTO attempts(rollout_id, attempt, worker_id, status, started, ended, error, logs) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            attempts,
        )
    store.close()


def api_times(url: str, n_rollouts: int, one: str) -> dict[str, float]:
    times = {}
    with httpx.Client(base_url=f"{url}/ui/api", timeout=60) as http:
        for name, path in QUERIES.items():
            path = path.format(last=n_rollouts - 50, one=one)
            samples = []
            for _ in range(5):
                started = time.perf_counter()
                http.get(path).raise_for_status()
                samples.append(time.perf_counter() - started)
            times[name] = statistics.median(samples) * 1000
    return times


def browser_times(browser, url: str) -> dict[str, float]:
    """Milliseconds (median of 5) from navigation to the first rows drawn, and from each change to its table."""
    from selenium.webdriver.support.ui import Select

    rows = "#rollouts tbody tr[data-rollout]"
    changes = {
        "failed only": (
            lambda: browser.find_element("name", "failed").click(),
            "#rollouts tbody tr[data-rollout] .badge.failed",
            lambda found: len(found) == 50,
        ),
        "status=timeout (none)": (
            lambda: Select(browser.find_element("name", "status")).select_by_value("timeout"),
            "#rollouts tbody td.empty",
            bool,
        ),
        "sort by reward": (
            lambda: browser.find_element("css selector", 'th[data-sort="reward"]').click(),
            'th.sorted[data-sort="reward"]',
            bool,
        ),
    }
    samples: dict[str, list[float]] = {"first paint": []} | {name: [] for name in changes}
    for round_ in range(5):
        for name, (change, css, check) in changes.items():
            started = time.perf_counter()
            browser.get(f"{url}/ui/?round={round_}{name}#/rollouts")  # a fresh page load each time
            chromium.wait_for(browser, rows, lambda found: len(found) == 50, timeout=30)
            samples["first paint"].append(time.perf_counter() - started)
            started = time.perf_counter()
            change()
            chromium.wait_for(browser, css, check, timeout=30)
            samples[name].append(time.perf_counter() - started)
    return {name: statistics.median(values) * 1000 for name, values in samples.items()}


def run(big: int = 100_000, small: int = 1_000) -> dict[str, dict[str, float]]:
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in (small, big):
            path = Path(tmp) / f"store-{n}.db"
            started = time.perf_counter()
            build_store(path, n)
            print(
                f"built a store of {n} rollouts x 6 calls in {time.perf_counter() - started:.1f} s "
                f"({path.stat().st_size / 2**20:.0f} MiB)",
                flush=True,
            )
            with LightningServer(path) as server:
                one = server.store.list_rollouts(limit=1, offset=n // 2)[0].rollout_id
                results[f"api {n}"] = api_times(server.url, n, one)
                if n == big and chromium.missing() is None:
                    browser = chromium.start()
                    try:
                        results["browser"] = browser_times(browser, server.url)
                    finally:
                        browser.quit()
    print(f"\n{'query (ms, median of 5)':<28} {small:>8} {big:>8}  ratio")
    for name in QUERIES:
        a, b = results[f"api {small}"][name], results[f"api {big}"][name]
        print(f"{name:<28} {a:8.1f} {b:8.1f}  {b / a:5.1f}x")
    for name, value in results.get("browser", {}).items():
        print(f"browser {name:<20} {value:8.0f} ms")
    return results


def test_dashboard_on_100k_rollouts() -> None:
    results = run()
    if "browser" in results:
        assert results["browser"]["first paint"] < 1000
        assert all(value < 300 for name, value in results["browser"].items() if name != "first paint")


if __name__ == "__main__":
    run(*(int(arg) for arg in sys.argv[1:]))
