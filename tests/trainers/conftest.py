"""The real vLLM server (the CPU build in .venv-vllm, `make vllm-venv`) shared by the vLLM tests of this folder.

One server per session (a start costs about a minute here): a LoRA-sync backend over a tiny random Llama with tied
embeddings (head size 64, which vLLM's CPU attention supports), saved with the trainer tokenizer. Without
.venv-vllm the tests that use it skip, unless ``AGL_REQUIRE_VLLM=1`` (set by ``.ci/run``) makes them fail.
"""

from __future__ import annotations

import logging
import time

import pytest
from vllm_venv import require_vllm

logger = logging.getLogger(__name__)


@pytest.fixture(scope="session")
def served(tmp_path_factory: pytest.TempPathFactory):
    """(backend, base model, tokenizer): a started LoRA-sync :class:`VLLMBackend` (fp32, max LoRA rank 8)."""
    require_vllm()
    pytest.importorskip("peft")
    from agentlightning.trainers.backends.vllm.server import VLLMBackend
    from agentlightning.trainers.models import tiny_model

    model, tokenizer = tiny_model(hidden_size=256)
    directory = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    started = time.perf_counter()
    backend = VLLMBackend(
        directory,
        tokenizer=tokenizer,
        sync="lora",
        dtype="float32",
        max_model_len=512,
        max_lora_rank=8,
        env={"VLLM_CPU_KVCACHE_SPACE": "1"},
        startup_timeout=400,
    ).start()
    logger.warning("vLLM server started in %.1f s", time.perf_counter() - started)
    yield backend, model, tokenizer
    backend.stop()
