"""Packaging: a built wheel and the editable install both ship ``agentlightning.adapters`` / ``.trainers``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROBE = (
    "import agentlightning, agentlightning.adapters, agentlightning.adapters.openai, agentlightning.trainers, "
    "agentlightning.testing; print(agentlightning.__file__); print(agentlightning.adapters.__file__); "
    "print(agentlightning.trainers.__file__)"
)


def _probe(env_path: str | None, cwd: Path) -> list[Path]:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    if env_path is not None:
        env["PYTHONPATH"] = env_path
    result = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return [Path(line) for line in result.stdout.split()]


def test_built_wheel_imports_adapters_and_trainers(tmp_path: Path) -> None:
    # Build from a copy of the packaged sources, so the shared work tree gets no build/ or egg-info debris.
    source = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in ("agentlightning", "adapters", "trainers"):
        shutil.copytree(ROOT / name, source / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    dist = tmp_path / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist)],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    (wheel,) = dist.glob("agentlightning_rl-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {
        "agentlightning/adapters/openai.py",
        "agentlightning/trainers/__init__.py",
        "agentlightning/testing/_server.py",
        "agentlightning/py.typed",
    } <= set(names)
    assert all(n.startswith(("agentlightning/", "agentlightning_rl-")) for n in names), "stray top-level files"

    target = tmp_path / "site"
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-compile",
            "--quiet",
            "--target",
            str(target),
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    package, adapters, trainers = _probe(str(target), elsewhere)
    for path in (package, adapters, trainers):
        assert path.is_relative_to(target), path


def test_editable_install_imports_adapters_and_trainers(tmp_path: Path) -> None:
    package, adapters, trainers = _probe(None, tmp_path)
    assert package == ROOT / "agentlightning" / "__init__.py"
    assert adapters == ROOT / "adapters" / "__init__.py"
    assert trainers == ROOT / "trainers" / "__init__.py"


def test_public_api_imports_no_torch_and_no_framework() -> None:
    # DESIGN: the core never imports torch or a framework; adapters patch a framework only once it is imported.
    heavy = (
        "torch",
        "numpy",
        "transformers",
        "trl",
        "peft",
        "vllm",
        "openai",
        "langchain_core",
        "langgraph",
        "agents",
        "autogen_agentchat",
        "autogen_core",
        "pydantic_ai",
        "agent_framework",
        "crewai",
        "llama_index",
        "smolagents",
        "dspy",
        "litellm",
        "ray",
    )
    code = (
        "import sys, agentlightning as agl\n"
        "for name in agl.__all__: getattr(agl, name)\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({heavy!r})))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", f"importing agentlightning's public API imported {result.stdout.strip()}"


@pytest.mark.parametrize(
    "beside",
    [["crewai"], ["llama-index-core", "llama-index-llms-openai"]],
    ids=["crewai", "llama-index"],
)
def test_all_extras_resolve_beside_frameworks_that_need_openai_2(beside: list[str], tmp_path: Path) -> None:
    # Both pin openai<3 (and crewai pydantic<2.13): the ranges must leave the resolver a solution, found against the
    # package registry (uv's resolver: pip's backtracks for over ten minutes through crewai's chromadb tree).
    from uv import find_uv_bin

    requirements = tmp_path / "requirements.in"
    requirements.write_text("\n".join([f"{ROOT}[all]", *beside]) + "\n")
    result = subprocess.run(
        [find_uv_bin(), "pip", "compile", "--quiet", "--python-version", "3.11", "--no-header", str(requirements)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    pinned = dict(line.split("==", 1) for line in result.stdout.splitlines() if "==" in line and " " not in line)
    assert pinned["openai"].startswith("2."), pinned["openai"]
    assert {"transformers", "trl", "langchain-openai", "openai-agents", "autogen-agentchat", *beside} <= set(pinned)
