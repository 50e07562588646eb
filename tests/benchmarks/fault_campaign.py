"""The fault campaign of issue 21, outside the default test run: ``agl server`` + ``agl client --nworkers 2`` with a
2-4-call agent and a fault-injecting upstream, one scenario after another, printing

    scenario | enqueued | succeeded | failed | lost | duplicated | call records lost | notes

"lost": rollouts missing from the store or left running (queued ones are counted as unfinished); "duplicated": a
rollout with more than one accepted result, or a call recorded twice; "call records lost": LLM calls of succeeded
rollouts without the server's record (``token_source != "server"``). Linux only (``/proc``, ``chattr``, ``prlimit``).

    python tests/benchmarks/fault_campaign.py                 # every scenario (about 10 minutes on 2 cores)
    python tests/benchmarks/fault_campaign.py --only upstream-down-8s,crash-at-head --rollouts 60
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "faults"))

from _harness import AglServer, FaultyUpstream, agl, wait_for  # noqa: E402


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


class Run:
    """One scenario: a server, a client with 2 workers, ``n`` rollouts, and a fault injected by ``fault(run)``."""

    def __init__(self, root: Path, name: str, tasks: list[dict], server_args: tuple[str, ...] = ()) -> None:
        self.dir = root / name
        self.dir.mkdir(parents=True)
        self.store = self.dir / "store.db"
        self.upstream = FaultyUpstream()
        self.server = AglServer(
            self.store, self.upstream.base_url, "--lease", "10", "--max-attempts", "3", *server_args
        ).start()
        dataset = self.server.http.post("/datasets", json={"records": tasks}).json()["dataset_id"]
        self.ids = self.server.http.post("/rollouts", json={"dataset_id": dataset}).json()["rollout_ids"]
        os.environ["AGL_SPOOL_DIR"] = str(self.dir / "spool")
        self.client = agl(
            "client",
            "--agent",
            "fault_agents:fault_agent",
            "--dataset-id",
            dataset,
            "--nworkers",
            "2",
            "--server-url",
            self.server.url,
            "--log-level",
            "ERROR",
        )
        self.notes: list[str] = []
        self.deleted = ""  # the deleted-db scenario's account (its store file is gone)
        self.rss: list[tuple[float, float, float]] = []  # (seconds, server MB, largest worker MB)

    def finished(self) -> int:
        try:
            counts = self.server.http.get("/stats").json()["rollouts"]
        except Exception:  # noqa: BLE001 - the server may be down on purpose
            return -1
        return sum(n for status, n in counts.items() if status in ("succeeded", "failed", "timeout", "cancelled"))

    def wait_done(self, timeout: float) -> None:
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if self.finished() >= len(self.ids):
                return
            if self.server.process is not None and self.server.process.poll() is None:
                workers = [_rss_mb(pid) for pid in _children(self.client.pid)] or [0.0]
                self.rss.append((time.monotonic() - started, _rss_mb(self.server.process.pid), max(workers)))
            time.sleep(1.0)
        self.notes.append(f"not finished after {timeout:.0f} s")

    def close(self) -> dict:
        self.server.http.post("/stop")
        try:
            self.client.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.client.pid, signal.SIGKILL)
            self.notes.append("client did not exit")
        self.server.stop()
        self.upstream.stop()
        return self.count()

    def count(self) -> dict:
        if self.deleted:
            spooled = len(list((self.dir / "spool").glob("*.json")))
            self.notes.append(f"{self.deleted}; {spooled} results finished after it are kept in the client's spool")
            return {
                "enqueued": len(self.ids),
                "succeeded": "-",
                "failed": "-",
                "lost": 0,
                "duplicated": "-",
                "call records lost": "-",
            }
        db = sqlite3.connect(self.store)
        rows = dict(db.execute("SELECT rollout_id, status FROM rollouts").fetchall())
        accepted = db.execute(
            "SELECT rollout_id, COUNT(*) FROM attempts WHERE status='succeeded' GROUP BY rollout_id HAVING COUNT(*) > 1"
        ).fetchall()
        doubled = db.execute(
            "SELECT COUNT(*) FROM (SELECT body FROM proxy_calls GROUP BY json_extract(body, "
            "'$.call_id') HAVING COUNT(*) > 1)"
        ).fetchone()[0]
        missing = db.execute(
            "SELECT COUNT(*) FROM calls c JOIN rollouts r USING (rollout_id) WHERE r.status="
            "'succeeded' AND c.kind='llm' AND json_extract(c.body, '$.token_source') != 'server'"
        ).fetchone()[0]
        statuses = [rows.get(rid) for rid in self.ids]
        return {
            "enqueued": len(self.ids),
            "succeeded": statuses.count("succeeded"),
            "failed": sum(s in ("failed", "timeout") for s in statuses),
            "lost": sum(s is None or s == "running" for s in statuses),
            "duplicated": len(accepted) + doubled,
            "call records lost": missing,
        }


def _tasks(n: int, head: list[dict] | None = None) -> list[dict]:
    rng = random.Random(0)
    return [*(head or []), *({"id": f"t{i}", "question": f"q{i}", "calls": rng.randint(2, 4)} for i in range(n))]


def _later(seconds: float, action: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(seconds), action()), daemon=True)
    thread.start()
    return thread


def scenario(run: Run, name: str) -> None:  # noqa: C901 - one branch per scenario, read top to bottom
    server, upstream = run.server, run.upstream
    if name == "worker-kill-9-x5":
        for _ in range(5):
            time.sleep(3.0)
            workers = _children(run.client.pid)
            if workers:
                os.kill(random.choice(workers), signal.SIGKILL)
    elif name == "server-kill-9-x2":
        time.sleep(4.0)
        server.kill()
        server.start()
        time.sleep(3.0)
        answered = len(upstream.arrivals)
        wait_for(lambda: len(upstream.arrivals) > answered, 30, "an upstream answer")
        time.sleep(0.02)  # inside 50 ms of an upstream answer
        server.kill()
        server.start()
        run.notes.append("2nd kill 20 ms after an upstream answer")
    elif name == "upstream-down-8s":
        time.sleep(4.0)
        upstream.refuse_for(8.0).join()
    elif name == "upstream-down-30s":
        time.sleep(4.0)
        upstream.refuse_for(30.0).join()
    elif name == "http-500-burst-20pct":
        stop = time.monotonic() + 20
        while time.monotonic() < stop:
            upstream.status = 500 if random.random() < 0.2 else None
            time.sleep(0.05)
        upstream.status = None
    elif name == "http-429-burst-30pct":
        upstream.retry_after = "1"
        stop = time.monotonic() + 20
        while time.monotonic() < stop:
            upstream.status = 429 if random.random() < 0.3 else None
            time.sleep(0.05)
        upstream.status = None
    elif name == "read-only-db":
        time.sleep(4.0)
        paths = [str(run.store.parent), *map(str, run.store.parent.glob("store.db*"))]
        subprocess.run(["chattr", "+i", *paths], check=True)
        time.sleep(8.0)
        subprocess.run(["chattr", "-i", *paths], check=True)
    elif name == "full-disk":
        time.sleep(4.0)
        assert server.process is not None
        resource.prlimit(server.process.pid, resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))
        time.sleep(8.0)
        resource.prlimit(server.process.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    elif name == "deleted-db":  # what was in the file is gone with it; nothing may be accepted into it afterwards
        time.sleep(4.0)
        before = run.finished()
        run.store.unlink()
        time.sleep(8.0)
        health = server.http.get("/health").status_code
        refused = server.http.post("/rollouts", json={"tasks": [{"q": 1}]}).status_code
        run.deleted = (
            f"{before} finished before the unlink (deleted with the file); after it: /health {health}, "
            f"enqueue {refused}, finished count stayed {run.finished()}"
        )


SCENARIOS = {
    "baseline": {},
    "worker-kill-9-x5": {},
    "server-kill-9-x2": {},
    "crash-at-head": {
        "head": [{"id": f"crash{i}", "question": f"c{i}", "mode": "exit" if i % 2 else "segfault"} for i in range(7)]
    },
    "upstream-down-8s": {},
    "upstream-down-30s": {},
    "http-500-burst-20pct": {},
    "http-429-burst-30pct": {},
    "read-only-db": {},
    "full-disk": {},
    "deleted-db": {"timeout": 1.0},
    "queued-5000": {"rollouts": 5000, "calls": 1, "timeout": 240.0},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=80, help="rollouts per scenario (queued-5000: 5000)")
    parser.add_argument("--only", help="comma-separated scenario names")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(SCENARIOS)
    root = Path(tempfile.mkdtemp(prefix="agl-campaign-"))
    print("scenario | enqueued | succeeded | failed | lost | duplicated | call records lost | notes")
    print("---|---|---|---|---|---|---|---")
    for name in names:
        spec = SCENARIOS[name]
        tasks = _tasks(spec.get("rollouts", args.rollouts), spec.get("head"))
        if spec.get("calls"):
            tasks = [{**task, "calls": spec["calls"]} for task in tasks]
        run = Run(root, name, tasks)
        started = time.monotonic()
        try:
            scenario(run, name)
            run.wait_done(spec.get("timeout", 900.0))
        finally:
            counts = run.close()
        if run.rss:
            peak = max(run.rss, key=lambda r: r[1])
            run.notes.append(
                f"RSS server {run.rss[0][1]:.0f}->{run.rss[-1][1]:.0f} MB (peak {peak[1]:.0f}), worker "
                f"{run.rss[0][2]:.0f}->{run.rss[-1][2]:.0f} MB"
            )
        run.notes.append(f"{time.monotonic() - started:.0f} s")
        if not run.deleted and counts["enqueued"] > counts["succeeded"] + counts["failed"] + counts["lost"]:
            run.notes.append(f"unfinished (queued): {counts['enqueued'] - counts['succeeded'] - counts['failed']}")
        print(f"{name} | " + " | ".join(str(v) for v in counts.values()) + f" | {'; '.join(run.notes)}", flush=True)
        (run.dir / "rss.json").write_text(json.dumps(run.rss))


if __name__ == "__main__":
    main()
