"""``agl dashboard RUN_DIR``: a real process serving a run's store and metrics read-only; the API behind the
token on ``agl server``; bad input answered clearly."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from chromium import wait_for
from conftest import TOKEN, Run, write_metrics

from agentlightning._cli import main as agl_main
from agentlightning.server._dashboard import read_metrics


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_api_refuses_without_the_token_and_answers_with_it(run: Run) -> None:
    api = f"{run.server.url}/ui/api"
    assert httpx.get(f"{api}/rollouts").status_code == 401
    assert httpx.get(f"{api}/rollouts", headers={"Authorization": "Bearer nope"}).status_code == 403
    page = httpx.get(f"{run.server.url}/ui/")  # the page itself holds no data
    assert page.status_code == 200 and "dashboard.js" in page.text
    body = httpx.get(
        f"{api}/rollouts", params={"limit": 5, "retried": True}, headers={"Authorization": f"Bearer {TOKEN}"}
    ).json()
    assert body["total"] == 5 and len(body["rows"]) == 5 and not body["more"]
    refused = httpx.get(f"{api}/rollouts", params={"sort": "nonsense"}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert refused.status_code == 422 and "sort: Input should be 'created'" in refused.json()["detail"]


def test_agl_dashboard_serves_a_run_directory_read_only(run: Run, browser, tmp_path: Path) -> None:
    port = free_port()
    before = (run.run_dir / "store.db").stat().st_mtime_ns
    process = subprocess.Popen(
        [sys.executable, "-m", "agentlightning._cli", "dashboard", str(run.run_dir), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                overview = httpx.get(f"{url}/ui/api/overview").json()
                break
            except httpx.TransportError:
                assert process.poll() is None and time.monotonic() < deadline, process.stdout.read()
                time.sleep(0.1)
        assert overview["counts"] == {"succeeded": 20, "failed": 1} and overview["settings"]["read_only"]
        assert httpx.get(f"{url}/ui/api/metrics").json()["total"] >= 3
        assert httpx.post(f"{url}/rollouts", json={"tasks": [{}]}).status_code in (404, 405)  # no write API
        browser.get(f"{url}/ui/#/rollouts?failed=true")
        rows = wait_for(browser, "#rollouts tbody tr[data-rollout]", lambda found: len(found) == 1)
        assert rows[0].get_attribute("data-rollout") == run.crashed[0]
    finally:
        process.terminate()
        process.wait(10)
    assert (run.run_dir / "store.db").stat().st_mtime_ns == before


def test_agl_dashboard_on_a_directory_without_a_run_says_so(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert agl_main(["dashboard", str(tmp_path)]) == 2
    assert "neither a store (store.db) nor metrics.jsonl" in capsys.readouterr().err
    assert agl_main(["dashboard", str(tmp_path), "--host", "0.0.0.0"]) == 2
    assert "without a token" in capsys.readouterr().err


def test_metrics_are_read_to_the_last_complete_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    write_metrics(path, range(1, 4))
    with path.open("a") as handle:
        handle.write('{"step": 4, "rew')  # the run is writing this row now
    total, rows = read_metrics(path)
    assert total == 3 and [row["step"] for row in rows] == [1, 2, 3]
    assert read_metrics(path, since=2)[1][0]["step"] == 3 and read_metrics(None) == (0, [])
