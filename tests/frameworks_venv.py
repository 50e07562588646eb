"""Running an agent with .venv-frameworks' python (CrewAI and LlamaIndex need openai<3; `make frameworks-venv`).

The mock server runs in the test's process; the agent runs in a subprocess (a script of ``adapters/frameworks/``)
that writes its rollout as JSON. Without .venv-frameworks the tests skip, unless ``AGL_REQUIRE_FRAMEWORKS=1`` (set
by ``.ci/run``) makes them fail.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from agentlightning.types import LLM, Rollout

FRAMEWORKS_PYTHON = Path(__file__).resolve().parents[1] / ".venv-frameworks" / "bin" / "python"
SCRIPTS = Path(__file__).resolve().parent / "adapters" / "frameworks"


def require_frameworks_venv() -> None:
    """Skip (or fail, with ``AGL_REQUIRE_FRAMEWORKS=1``) when .venv-frameworks is absent."""
    if not FRAMEWORKS_PYTHON.exists():
        reason = ".venv-frameworks is absent: `make frameworks-venv` installs CrewAI and LlamaIndex with openai 2"
        if os.environ.get("AGL_REQUIRE_FRAMEWORKS") == "1":
            pytest.fail(f"AGL_REQUIRE_FRAMEWORKS=1 but {reason}")
        pytest.skip(reason)


def run_rollout(script: str, scenario: str, llm: LLM, workdir: Path) -> Rollout:
    """Run ``scenario`` of ``frameworks/<script>`` once as a rollout against ``llm``; its rollout, as recorded."""
    require_frameworks_venv()
    out = workdir / f"{scenario}.json"
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["CREWAI_STORAGE_DIR"] = str(workdir / "crewai")  # CrewAI's memory and task databases
    result = subprocess.run(
        [str(FRAMEWORKS_PYTHON), str(SCRIPTS / script), scenario, llm.model_dump_json(), str(out)],
        cwd=workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"{script} {scenario} exited {result.returncode}:\n{result.stderr[-4000:]}"
    return Rollout.model_validate_json(out.read_text())
