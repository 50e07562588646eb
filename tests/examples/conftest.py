"""Examples are not an installed package: put the repository root on sys.path so ``examples.*`` imports."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from examples.common import DEFAULT_DATA_DIR  # noqa: E402


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The shared example data (``../shared/data`` beside the clone); tests needing it skip when it is absent."""
    if not DEFAULT_DATA_DIR.is_dir():
        pytest.skip(f"example data directory {DEFAULT_DATA_DIR} is missing (see the examples' README)")
    return DEFAULT_DATA_DIR
