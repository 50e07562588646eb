"""The Python snippets of docs/examples.md run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from examples.common import REPO_ROOT

SNIPPETS = re.findall(r"```python\n(.*?)```", (REPO_ROOT / "docs" / "examples.md").read_text(), re.DOTALL)


def test_the_page_has_snippets() -> None:
    assert len(SNIPPETS) == 3


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_snippet_runs(index: int, data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    exec(compile(SNIPPETS[index], f"docs/examples.md snippet {index}", "exec"), {})
