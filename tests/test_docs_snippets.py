"""Every python snippet of the README and of docs/ runs as written and prints what the page says it prints (the
``# ...`` lines closing a block, indented or not; wrapped or elided ones, with ``...``, are not compared).

Each page runs in a fresh interpreter (pages set process-wide state: an OpenTelemetry provider, installed adapters),
its blocks in order, each block in a fresh namespace, so a block that uses a name it does not define fails as it
would for a reader who copies only that block (code several blocks share is a ``# name.py`` file they import, see
below). The info string after ``python`` says otherwise, visibly in the page:

- ``python fragment``: an excerpt (a signature, a line of a larger program the page describes); it must parse, it
  is not run.
- ``python heavy: <reason>``: it needs what a test machine lacks (a GPU, vLLM, a cluster, a long training run); it
  is reported as skipped with that reason.
- ``python data``: it reads the examples' data (``../shared/data``, see the examples' README); it runs where that
  directory exists and is reported as skipped where it does not, as the example tests are.

A block whose first line is ``# <name>.py`` is a script or module the page says to save: it is written to that file
in the page's working directory and run with ``python <name>.py``; later blocks of the page can import it. The
blocks of a page run with the working directory a fresh temporary directory, the repository on ``PYTHONPATH`` (the
examples import as they do from a clone) and ``HF_HUB_OFFLINE=1``.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from frameworks_venv import FRAMEWORKS_PYTHON, require_frameworks_venv

ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = ROOT.parent / "shared" / "data"  # examples.common.DEFAULT_DATA_DIR
BLOCK = re.compile(r"```python([^\n]*)\n(.*?)```", flags=re.S)
PAGES = sorted(
    str(path.relative_to(ROOT))
    for path in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    if BLOCK.search(path.read_text())
)
# CrewAI and LlamaIndex need openai<3: their pages run in .venv-frameworks (`make frameworks-venv`).
FRAMEWORKS_VENV_PAGES = {"docs/frameworks/crewai.md", "docs/frameworks/llama_index.md"}
PAGE_TIMEOUT = 240
# Each block's source is kept in linecache, so that inspect.getsource works on what it defines as it would in a file
# (smolagents' @tool reads its function's source).
RUNNER = """
import contextlib, io, json, linecache, re, subprocess, sys, traceback
page, results = sys.argv[1], sys.argv[2]
blocks = re.findall(r"```python([^\\n]*)\\n(.*?)```", open(page).read(), flags=re.S)
with open(results, "w") as out:
    for number, (info, block) in enumerate(blocks):
        if info.strip() not in ("", "data"):
            continue
        namespace = {"__name__": "__main__"}
        name = f"{page}[python block {number}]"
        linecache.cache[name] = (len(block), None, block.splitlines(keepends=True), name)
        printed, error = io.StringIO(), None
        try:
            with contextlib.redirect_stdout(printed):
                script = re.match(r"# ([\\w.-]+\\.py)\\n", block)
                if script:
                    open(script.group(1), "w").write(block)
                    run = subprocess.run([sys.executable, script.group(1)], capture_output=True, text=True)
                    print(run.stdout, end="")
                    if run.returncode:
                        raise RuntimeError(f"python {script.group(1)} exited {run.returncode}:\\n{run.stderr[-3000:]}")
                else:
                    exec(compile(block, name, "exec"), namespace)
        except BaseException:
            error = traceback.format_exc()[-4000:]
        out.write(json.dumps({"index": number, "printed": printed.getvalue(), "error": error}) + "\\n")
        out.flush()
"""


def page_blocks(page: str) -> list[tuple[str, str]]:
    """The (info string, source) of each python block of ``page``."""
    return [(info.strip(), source) for info, source in BLOCK.findall((ROOT / page).read_text())]


def expected_output(block: str) -> list[str]:
    """The comment lines closing ``block`` (its documented output), unless one of them elides with '...'."""
    lines = block.rstrip("\n").split("\n")
    tail: list[str] = []
    while lines and lines[-1].lstrip().startswith("# "):  # indented: printed under `if __name__ == "__main__":`
        tail.insert(0, lines.pop().lstrip()[2:])
    return [] if any("..." in line for line in tail) else tail


@functools.cache
def run_page(page: str) -> tuple[dict[int, dict], str]:
    """Run the blocks of ``page`` in a fresh interpreter; each run block's result by index, and the stderr."""
    if page in FRAMEWORKS_VENV_PAGES:
        require_frameworks_venv()
        python = str(FRAMEWORKS_PYTHON)
    else:
        python = sys.executable
    workdir = Path(tempfile.mkdtemp(prefix="agl-docs-"))
    results = workdir / "results.jsonl"
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), CREWAI_STORAGE_DIR=str(workdir / "crewai"))
    env.update(LITELLM_LOCAL_MODEL_COST_MAP="True")  # DSPy and LiteLLM would fetch their price list at import
    try:
        run = subprocess.run(
            [python, "-c", RUNNER, str(ROOT / page), str(results)],
            capture_output=True,
            text=True,
            timeout=PAGE_TIMEOUT,
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
        )
        stderr = run.stderr
    except subprocess.TimeoutExpired as exc:
        stderr = f"the page ran past {PAGE_TIMEOUT} s\n{exc.stderr or ''}"
    lines = results.read_text().splitlines() if results.exists() else []
    return {entry["index"]: entry for entry in map(json.loads, lines)}, stderr


CASES = [(page, number) for page in PAGES for number in range(len(page_blocks(page)))]


@pytest.mark.parametrize(("page", "number"), CASES, ids=[f"{page}[{number}]" for page, number in CASES])
def test_doc_snippet_runs_and_prints_what_it_says(page: str, number: int) -> None:
    info, source = page_blocks(page)[number]
    where = f"{page}, python block {number}"
    if info.startswith("fragment"):
        ast.parse(source, filename=where)  # an excerpt still reads as Python
        return
    if info.startswith("heavy"):
        reason = info.partition(":")[2].strip()
        assert reason, f"{where}: 'python heavy' needs a reason ('python heavy: needs a GPU')"
        pytest.skip(f"{where} is marked heavy: {reason}")
    if info == "data" and not DATA_DIR.is_dir():
        pytest.skip(f"{where} reads the example data directory {DATA_DIR}, which is missing (see the examples' README)")
    assert info in ("", "data"), (
        f"{where}: unknown info string {info!r} (fragment, heavy: <reason>, data; a block runs on its own: code it "
        "shares with other blocks goes in a '# name.py' block they import)"
    )
    results, stderr = run_page(page)
    assert number in results, f"{where} did not run (the page's interpreter died before it):\n{stderr[-3000:]}"
    result = results[number]
    assert result["error"] is None, f"{where} failed:\n{result['error']}"
    printed = [line.rstrip() for line in result["printed"].splitlines()]
    for line in expected_output(source):
        assert line.rstrip() in printed, f"{where}: documented output {line!r} not printed; got {printed}"
