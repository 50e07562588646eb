"""scripts/gpu_check.py where it is meant to run: torch and transformers, but not this package (a lent GPU machine
gets the repository's files, not an install). The dry run on CPU, in a subprocess that cannot import agentlightning."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
# Runs the script as `python scripts/gpu_check.py ...` would, with any import of the packages in $MISSING failing.
WITHOUT_PACKAGES = """import os, runpy, sys

class Missing:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in os.environ["MISSING"].split(","):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Missing())
sys.argv = [sys.argv[1], *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _run(*args: str, cwd: Path, missing: str = "agentlightning") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": "", "HF_HUB_OFFLINE": "1", "MISSING": missing}
    command = [sys.executable, "-c", WITHOUT_PACKAGES, str(ROOT / "scripts" / "gpu_check.py"), *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


SMALL = ["--size", "tiny", "--device", "cpu", "--dtype", "float32", "--batch", "2", "--prompt-len", "8"]
SMALL += ["--new-tokens", "4", "--update-rows", "2", "--update-len", "16", "--micro-batch", "2", "--skip-vllm"]


def test_gpu_check_with_torch_alone_measures_the_device_and_says_what_else_it_needs(tmp_path) -> None:
    out = tmp_path / "gpu_check.json"
    done = _run(*SMALL, "--json", str(out), cwd=tmp_path, missing="agentlightning,transformers,peft,vllm")
    assert done.returncode == 0, done.stderr[-3000:]
    measured = {row["measurement"]: row for row in json.loads(out.read_text())}
    assert measured["device"]["measured_matmul_flops"] > 0
    assert "need transformers (No module named 'transformers')" in measured["model"]["skipped"]
    assert list(measured) == ["device", "model", "total"]


def test_gpu_check_dry_run_needs_no_agentlightning(tmp_path) -> None:
    pytest.importorskip("transformers")
    assert _run("--help", cwd=tmp_path).returncode == 0
    out = tmp_path / "gpu_check.json"
    done = _run(*SMALL, "--json", str(out), cwd=tmp_path)  # the default budget, 480 s: ample for the tiny model
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())
    measured = {row["measurement"]: row for row in rows}
    assert measured["generate/batch2"]["tokens"] == 2 * 4  # every row decoded its 4 tokens
    assert measured["update/full"]["seconds"] > 0
    assert measured["logprob_forward/full"]["seconds"] > 0
    assert not [row for row in rows if str(row.get("skipped", "")).startswith("budget")]
    assert rows[-1]["measurement"] == "total" and rows[-1]["budget_s"] == 480
    assert 0 < rows[-1]["elapsed_s"] < 480
    assert "No module named 'agentlightning" not in done.stderr


def test_gpu_check_skips_the_phases_its_budget_cannot_fit(tmp_path) -> None:
    """The first generation batch is given 60 s before one has been timed, the full update 120 s: with 100 s in all,
    generation runs and every update phase is skipped, each saying why."""
    pytest.importorskip("transformers")
    out = tmp_path / "gpu_check.json"
    done = _run(*SMALL, "--budget-s", "100", "--json", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())
    measured = {row["measurement"]: row for row in rows}
    assert measured["generate/batch1"]["seconds"] > 0 and measured["generate/batch2"]["tokens"] == 2 * 4
    skipped = [label for label, row in measured.items() if str(row.get("skipped", "")).startswith("budget: ")]
    assert skipped[:2] == ["update/full", "logprob_forward/full"]  # and LoRA's two where peft is installed
    assert re.fullmatch(r"budget: \d+ s left, needs ~120 s", measured["update/full"]["skipped"])
    assert "seconds" not in measured["update/full"]
    assert rows[-1]["measurement"] == "total" and rows[-1]["budget_s"] == 100
    assert rows[-1]["elapsed_s"] < 100
