"""Fixtures of the command-agent tests."""

from __future__ import annotations

import os
import shutil

import pytest


@pytest.fixture
def bubblewrap() -> None:
    """``bwrap`` on PATH; skipped with how to install it when missing, failed instead when AGL_REQUIRE_BUBBLEWRAP=1
    (as `.ci/run` sets after `make bubblewrap`)."""
    if shutil.which("bwrap") is None:
        reason = "bubblewrap (bwrap) is not installed: make bubblewrap (apt-get install bubblewrap)"
        if os.environ.get("AGL_REQUIRE_BUBBLEWRAP") == "1":
            pytest.fail(f"AGL_REQUIRE_BUBBLEWRAP=1 but {reason}")
        pytest.skip(reason)
