"""scripts/vllm_server_check.py on the tiny model: against vLLM's CPU build (.venv-vllm) with every phase, and with a
budget that fits none of the vLLM phases, where it runs from the repository's files (no installed package), as on a
lent GPU machine."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from vllm_venv import require_vllm

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "vllm_server_check.py"
# Runs the script as `python scripts/vllm_server_check.py ...` would where the package is not installed (the editable
# install's finder removed), then says where agentlightning.trainers came from and what led sys.path (the repository
# root, put there by the script, when it came from the repository's files).
WITHOUT_INSTALL = """import runpy, sys

sys.meta_path = [finder for finder in sys.meta_path if "__editable__" not in getattr(finder, "__module__", "")]
sys.argv = [sys.argv[1], *sys.argv[2:]]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    print("trainers from", sys.modules["agentlightning.trainers"].__file__, "with sys.path[0]", sys.path[0])
"""
SMALL = ["--size", "tiny", "--requests", "4", "--concurrency", "2", "--max-tokens", "8", "--syncs", "2"]


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": "", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def _rows(path: Path) -> dict[str, dict]:
    return {row["measurement"]: row for row in json.loads(path.read_text())}


@pytest.mark.slow
def test_vllm_server_check_measures_both_paths_and_both_sync_modes(tmp_path) -> None:
    require_vllm()
    out = tmp_path / "check.json"
    done = _run([sys.executable, str(SCRIPT), *SMALL, "--json", str(out)], cwd=tmp_path)  # default budget, 480 s
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    measured = _rows(out)
    for path in ("direct", "proxy"):
        row = measured[f"requests/{path}"]
        assert row["tokens"] == 4 * 8 and row["tokens_per_s"] > 0, row  # every answer max_tokens long
    assert measured["requests/ratio"]["proxy_vs_direct"] > 0
    for mode in ("lora", "disk"):
        assert measured[f"start/{mode}"]["seconds"] > 0
        row = measured[f"sync/{mode}"]
        assert len(row["each_s"]) == 2 and all(seconds > 0 for seconds in row["each_s"]) and row["seconds"] > 0
    assert measured["sync/lora"]["served"] == "policy-v2"  # the adapter of the last sync
    assert not [label for label, row in measured.items() if "skipped" in row]
    assert measured["total"]["budget_s"] == 480 and 0 < measured["total"]["elapsed_s"] < 480


def test_vllm_server_check_skips_what_its_budget_cannot_fit(tmp_path) -> None:
    """A server's start is given 240 s before one has been timed: with 60 s the model is built and saved, both
    servers' starts are skipped for the budget and the phases on them for want of a server."""
    out = tmp_path / "check.json"
    command = [sys.executable, "-c", WITHOUT_INSTALL, str(SCRIPT), *SMALL, "--budget-s", "60", "--json", str(out)]
    done = _run(command, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"trainers from {ROOT / 'trainers' / '__init__.py'} with sys.path[0] {ROOT}" in done.stdout
    measured = _rows(out)
    assert measured["model"]["params"] > 0 and measured["model"]["seconds"] > 0
    for start in ("start/lora", "start/disk"):
        assert re.fullmatch(r"budget: \d+ s left, needs ~240 s", measured[start]["skipped"]), measured[start]
    for label in ("requests/direct", "requests/proxy", "sync/lora", "sync/disk"):
        assert measured[label]["skipped"].startswith("no server: start/"), measured[label]
    assert "requests/ratio" not in measured
    assert measured["total"]["budget_s"] == 60 and measured["total"]["elapsed_s"] < 60
