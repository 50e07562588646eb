"""What a newcomer's mistakes get from ``agl``, run as their shell runs it: one ``agl <command>: error:`` line naming
the fix and exit 2, not a traceback; and the mistake refused before anything slow starts."""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agentlightning._uvicorn import BackgroundServer
from agentlightning.server import LightningServer

AGENT = """
import openai


def solve(task, llm):
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    reply = client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": task["q"]}])
    return float(reply.choices[0].message.content == task["a"])
"""


def _agl(
    *arguments: str, cwd: Path | None = None, timeout: float = 120, **env: str | None
) -> subprocess.CompletedProcess[str]:
    """``agl`` as a shell runs it, offline unless ``HF_HUB_OFFLINE=None``; ``env`` entries of None are unset."""
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", **env}
    return subprocess.run(
        [str(Path(sys.executable).parent / "agl"), *arguments],  # the console script, as a shell runs it
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={key: value for key, value in environment.items() if value is not None},
    )


def _closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


NEEDS_TRAIN = pytest.mark.skipif(
    importlib.util.find_spec("trl") is None, reason="agl train and agl server --model need the [train] extra"
)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A newcomer's project folder: an agent module and a one-task dataset."""
    (tmp_path / "my_agent.py").write_text(AGENT)
    (tmp_path / "tasks.jsonl").write_text('{"q": "2 + 2?", "a": "4"}\n')
    return tmp_path


def _refused(shown: subprocess.CompletedProcess[str], command: str) -> str:
    """The one error line of a refused command (exit 2, no traceback)."""
    assert shown.returncode == 2, shown.stdout + shown.stderr
    assert "Traceback" not in shown.stderr, shown.stderr
    errors = [line for line in shown.stderr.splitlines() if line.startswith(f"agl {command}: error: ")]
    assert len(errors) == 1, shown.stderr
    return errors[0]


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A loopback port another process (here: this one) listens on."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        yield other.getsockname()[1]


def test_server_on_a_busy_port_names_the_fix(tmp_path: Path, busy_port: int) -> None:
    shown = _agl("server", "--port", str(busy_port), "--store", str(tmp_path / "store.db"))
    line = _refused(shown, "server")
    assert f"127.0.0.1:{busy_port}" in line and "another process already uses that port" in line
    assert "--port" in line


def test_dashboard_on_a_busy_port_does_not_claim_the_other_process_url(tmp_path: Path, busy_port: int) -> None:
    (tmp_path / "metrics.jsonl").write_text("")
    shown = _agl("dashboard", str(tmp_path), "--port", str(busy_port))
    line = _refused(shown, "dashboard")
    assert f"127.0.0.1:{busy_port}" in line and "--port" in line
    assert f":{busy_port}" not in shown.stdout  # the URL it never served is not announced as its own


def test_dashboard_announces_the_url_it_serves_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text("")
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "agl"), "dashboard", str(tmp_path), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # printed once it listens
        url = line.split(" on ", 1)[1].split("/ui/", 1)[0]
        assert url.startswith("http://127.0.0.1:") and not url.endswith(":0"), line
        assert httpx.get(f"{url}/ui/").status_code == 200
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=20) == 0
    finally:
        process.kill()
        process.communicate()


def test_rollouts_list_takes_a_run_directory_like_the_dashboard(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    with LightningServer(run / "store.db") as server:
        server.enqueue([{"id": "task-in-the-run"}])
    shown = _agl("rollouts", "list", "--store", str(run))
    assert shown.returncode == 0, shown.stderr
    assert "task-in-the-run" in shown.stdout
    line = _refused(_agl("rollouts", "list", "--store", str(tmp_path)), "rollouts")  # a folder, but no run's
    assert "without a store.db" in line and str(tmp_path) in line


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is not None, reason="tensorboard is installed here")
@NEEDS_TRAIN
def test_report_to_a_missing_package_is_refused_before_the_model_loads(project: Path) -> None:
    tmp_path = project
    started = time.monotonic()
    shown = _agl(
        "train",
        "my_agent:solve",
        "--dataset",
        "tasks.jsonl",
        "--model",
        "smollm2",
        "--output-dir",
        str(tmp_path / "run"),
        "--report-to",
        "tensorboard",
        cwd=tmp_path,
    )
    line = _refused(shown, "train")
    assert "pip install tensorboard" in line
    assert not (tmp_path / "run").exists()  # refused before the run began: no run directory, no model loaded
    assert time.monotonic() - started < 40  # the interpreter and imports only (it took 46 s before the model failed)


def _train_model(project: Path, model: str, **env: str | None) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    shown = _agl(
        "train",
        "my_agent:solve",
        "--dataset",
        "tasks.jsonl",
        "--model",
        model,
        "--output-dir",
        str(project / "run"),
        cwd=project,
        **env,
    )
    return shown, time.monotonic() - started


@NEEDS_TRAIN
def test_an_unknown_model_offline_is_refused_at_once(project: Path) -> None:
    shown, seconds = _train_model(project, "nosuch-org/nosuch-model")
    line = _refused(shown, "train")
    assert "'nosuch-org/nosuch-model'" in line and "HF_HUB_OFFLINE=1" in line and "'smollm2'" in line
    assert not (project / "run").exists()  # refused before the run began, not by the model loader
    assert seconds < 40, seconds


@NEEDS_TRAIN
def test_an_unknown_model_with_the_hub_out_of_reach_fails_without_retrying(project: Path) -> None:
    hub = f"http://127.0.0.1:{_closed_port()}"  # a hub that cannot be reached, as on a machine offline
    online = {"HF_HUB_OFFLINE": None, "TRANSFORMERS_OFFLINE": None, "HF_ENDPOINT": hub}
    shown, seconds = _train_model(project, "nosuch-org/nosuch-model", **online)
    line = _refused(shown, "train")
    assert "the Hugging Face hub cannot be reached" in line and "HF_HUB_OFFLINE=1" in line
    assert "Retrying" not in shown.stderr  # the hub client's download retries (20 lines, 66 s) never start
    assert not (project / "run").exists()
    assert seconds < 40, seconds


@NEEDS_TRAIN
def test_an_unknown_model_the_hub_does_not_have_is_refused_after_one_request(project: Path) -> None:
    asked: list[str] = []

    async def repo_not_found(request: Request) -> Response:  # what huggingface.co answers for a missing model
        asked.append(request.url.path)
        return JSONResponse({"error": "Repository not found"}, 401, headers={"x-error-code": "RepoNotFound"})

    hub = BackgroundServer(Starlette(routes=[Route("/{path:path}", repo_not_found)]), name="hub").start()
    try:
        online = {"HF_HUB_OFFLINE": None, "TRANSFORMERS_OFFLINE": None, "HF_ENDPOINT": hub.url}
        shown, seconds = _train_model(project, "nosuch-org/nosuch-model", **online)
    finally:
        hub.stop()
    line = _refused(shown, "train")
    assert "the Hugging Face hub has no such model" in line
    assert asked.count("/api/models/nosuch-org/nosuch-model") == 1  # asked once,
    assert not [path for path in asked if "/resolve/" in path]  # and no file download was tried (nor retried)
    assert not (project / "run").exists()


@NEEDS_TRAIN
def test_server_model_that_cannot_load_is_refused_before_the_server_starts(tmp_path: Path) -> None:
    shown = _agl("server", "--model", "nosuch-org/nosuch-model", "--port", "0", "--store", str(tmp_path / "s.db"))
    line = _refused(shown, "server")
    assert "'nosuch-org/nosuch-model'" in line and "HF_HUB_OFFLINE=1" in line
    assert not (tmp_path / "s.db").exists()


def test_client_with_a_wrong_url_fails_fast_with_what_to_check(project: Path) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    started = time.monotonic()
    shown = _agl("client", "--server-url", url, "--agent", "my_agent:solve", "--dataset", "tasks.jsonl", cwd=project)
    line = _refused(shown, "client")
    assert f"no Lightning Server answers at {url}" in line and "--server-url" in line
    assert time.monotonic() - started < 45  # a server still starting gets 20 s, not the 66 s it used to take


def test_client_url_ending_in_v1_gets_the_hint(project: Path, tmp_path: Path) -> None:
    with LightningServer(tmp_path / "store.db") as server:
        shown = _agl(
            "client", "--server-url", f"{server.url}/v1", "--agent", "my_agent:solve", "--dataset", "tasks.jsonl",
            cwd=project,
        )  # fmt: skip
    line = _refused(shown, "client")
    assert "the Lightning Server URL has no /v1" in line and f"use {server.url}" in line
