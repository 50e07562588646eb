"""scripts/gpu_check.py where it is meant to run: torch and transformers, but not this package (a lent GPU machine
gets the repository's files, not an install). The dry run on CPU, in a subprocess that cannot import agentlightning."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
# Runs the script as `python scripts/gpu_check.py ...` would, with any import of agentlightning failing.
WITHOUT_PACKAGE = """import runpy, sys

class NoAgentLightning:
    def find_spec(self, name, path=None, target=None):
        if name == "agentlightning" or name.startswith("agentlightning."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoAgentLightning())
sys.argv = [sys.argv[1], *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": "", "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-c", WITHOUT_PACKAGE, str(ROOT / "scripts" / "gpu_check.py"), *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_gpu_check_dry_run_needs_no_agentlightning(tmp_path) -> None:
    assert _run("--help", cwd=tmp_path).returncode == 0
    out = tmp_path / "gpu_check.json"
    small = ["--size", "tiny", "--device", "cpu", "--dtype", "float32", "--batch", "2", "--prompt-len", "8"]
    small += ["--new-tokens", "4", "--update-rows", "2", "--update-len", "16", "--micro-batch", "2", "--skip-vllm"]
    done = _run(*small, "--json", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    measured = {row["measurement"]: row for row in json.loads(out.read_text())}
    assert measured["generate/batch2"]["tokens"] == 2 * 4  # every row decoded its 4 tokens
    assert measured["update/full"]["seconds"] > 0
    assert "No module named 'agentlightning" not in done.stderr
