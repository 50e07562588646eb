"""The snippets of docs/lightning_rl.md run as written, in order."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "lightning_rl.md"


def test_doc_snippets_run(capsys) -> None:  # type: ignore[no-untyped-def]
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) >= 5
    namespace: dict[str, object] = {}
    for number, block in enumerate(blocks):
        exec(compile(block, f"{DOC.name}[python block {number}]", "exec"), namespace)  # noqa: S102
    printed = capsys.readouterr().out
    assert "[('r0', 0.7071, 0.5), ('r0', 0.7071, 0.5), ('r1', -0.7071, 1.0)]" in printed
    assert "[[101, 102, 103], [101, 102, 104], [101, 102, 103]]" in printed
