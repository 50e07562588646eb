"""The ``agl`` command as a user's shell runs it: ``--version``, and no log line per HTTP request at INFO."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

from agentlightning.server import LightningServer


def _agl(*arguments: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).parent / "agl"), *arguments],  # the console script, as a shell runs it
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


def test_agl_version_names_the_installed_distribution() -> None:
    shown = _agl("--version")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == f"agl {importlib.metadata.version('agentlightning-rl')}"


def test_requests_are_logged_only_at_debug(tmp_path: Path) -> None:
    with LightningServer(tmp_path / "store.db", upstream_url="http://127.0.0.1:9/v1") as server:
        server.enqueue([{"id": "t1"}])
        quiet = _agl("rollouts", "list", "--server-url", server.url, AGL_LOG_LEVEL="INFO")
        loud = _agl("rollouts", "list", "--server-url", server.url, "--log-level", "DEBUG")
    assert quiet.returncode == 0 and loud.returncode == 0, quiet.stderr + loud.stderr
    assert "t1" in quiet.stdout
    assert "HTTP Request" not in quiet.stderr
    assert "HTTP Request: GET" in loud.stderr  # the line is there when asked for: the test can tell
