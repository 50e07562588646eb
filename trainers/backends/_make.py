"""The backend a run's configuration names: the HF backend, a vLLM server, or the user's own :class:`Backend`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentlightning.trainers.backends.base import Backend
    from agentlightning.trainers.config import TrainConfig
    from agentlightning.trainers.policies import PolicyMap

CHECK_MESSAGES = [{"role": "user", "content": "What is 2 + 3? Answer briefly."}]
"""The conversation whose sampled tokens are scored by both sides after each vLLM sync."""


def make_backend(
    config: TrainConfig,
    policy: Any,
    tokenizer: Any,
    model_name: str,
    model_version: str,
    base_dir: Path | None,
    policies: PolicyMap | None = None,
) -> Backend:
    """The :class:`~agentlightning.trainers.backends.base.Backend` that ``config.backend`` names, serving ``policy``
    (not started), with one adapter per policy of ``policies``. ``base_dir`` is the initial model a vLLM server
    started here loads. A ``Backend`` instance in ``config.backend`` is returned as it is (never written to)."""
    if config.backend == "hf":
        from agentlightning.trainers.backends.hf.server import HFBackendServer

        return HFBackendServer(
            policy,
            tokenizer,
            model_name=model_name,
            model_version=model_version,
            max_batch_size=config.max_batch_size,
            always_logprobs=True,
            default_max_tokens=config.max_completion_length or 512,
            max_tokens_limit=config.max_completion_length,
            policies=policies,
        )
    if config.backend == "vllm":
        from agentlightning.trainers.backends.vllm.server import VLLMBackend

        options = config.vllm
        return VLLMBackend(
            None if options.url else base_dir,
            url=options.url,
            policy=policy,
            tokenizer=tokenizer,
            sync=config.vllm_sync,  # type: ignore[arg-type]
            model_name=None if options.url else model_name,
            model_version=model_version,
            python=options.python,
            dtype=options.dtype,
            gpu_memory_utilization=options.gpu_memory_utilization,
            max_model_len=options.max_model_len,
            tensor_parallel_size=options.tensor_parallel_size,
            max_lora_rank=options.max_lora_rank,
            extra_args=options.extra_args,
            env=options.env,
            startup_timeout=options.startup_timeout,
            check_messages=CHECK_MESSAGES if options.check_logprobs else None,
            check_every=options.check_logprobs_every,
            keep_previous=config.max_staleness > 0,
            policies=policies,
        )
    return config.backend
