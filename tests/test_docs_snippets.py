"""The python snippets of the README and of the capture, testing, framework, evaluation and errors docs run as
written, in order, and print what the pages say they print (the ``# ...`` lines closing a block; wrapped or elided
ones, with ``...``, are not compared).

Each page runs in a fresh interpreter: pages set process-wide state (an OpenTelemetry provider, installed adapters)
and one page's leftovers must not make another pass.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from frameworks_venv import FRAMEWORKS_PYTHON, require_frameworks_venv

DOCS = Path(__file__).resolve().parents[1] / "docs"
PAGES = [
    "../README.md",
    "capture.md",
    "testing.md",
    "frameworks/langchain.md",
    "frameworks/openai_agents.md",
    "frameworks/autogen.md",
    "frameworks/pydantic_ai.md",
    "frameworks/agent_framework.md",
    "frameworks/smolagents.md",
    "frameworks/google_adk.md",
    "evaluation.md",
    "errors.md",
]
# CrewAI and LlamaIndex need openai<3: their pages run in .venv-frameworks (`make frameworks-venv`).
FRAMEWORKS_VENV_PAGES = ["frameworks/crewai.md", "frameworks/llama_index.md"]
# Each block's source is kept in linecache, so that inspect.getsource works on what it defines as it would in a file
# (smolagents' @tool reads its function's source).
RUNNER = """
import linecache, re, sys
blocks = re.findall(r"```python\\n(.*?)```", open(sys.argv[1]).read(), flags=re.S)
namespace = {}
for number, block in enumerate(blocks):
    name = f"{sys.argv[1]}[python block {number}]"
    linecache.cache[name] = (len(block), None, block.splitlines(keepends=True), name)
    exec(compile(block, name, "exec"), namespace)
"""


def expected_output(block: str) -> list[str]:
    """The comment lines closing ``block`` (its documented output), unless one of them elides with '...'."""
    lines = block.rstrip("\n").split("\n")
    tail: list[str] = []
    while lines and lines[-1].startswith("# "):
        tail.insert(0, lines.pop()[2:])
    return [] if any("..." in line for line in tail) else tail


def run_page(page: str, python: str) -> None:
    """Run the snippets of ``page`` with ``python`` and check the output they document."""
    path = DOCS / page
    blocks = re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)
    assert blocks, f"{page} has no python snippets"
    result = subprocess.run(
        [python, "-c", RUNNER, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=DOCS.parent,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, f"{page}: a snippet failed\n{result.stderr[-3000:]}"
    printed = [line.rstrip() for line in result.stdout.splitlines()]
    for block in blocks:
        for line in expected_output(block):
            assert line.rstrip() in printed, f"{page}: documented output {line!r} not printed; got {printed}"


@pytest.mark.parametrize("page", PAGES)
def test_doc_page_snippets_run_and_print_what_they_say(page: str) -> None:
    run_page(page, sys.executable)


@pytest.mark.parametrize("page", FRAMEWORKS_VENV_PAGES)
def test_frameworks_venv_page_snippets_run_and_print_what_they_say(page: str) -> None:
    """The pages of the frameworks that need openai<3, run with .venv-frameworks' python."""
    require_frameworks_venv()
    run_page(page, str(FRAMEWORKS_PYTHON))
