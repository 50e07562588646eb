"""vLLM worker extension (``--worker-extension-cls``): reload the policy's weights from disk, tied embeddings included.

vLLM's own ``reload_weights`` (vllm 0.31) updates ``embed_tokens`` of a tied-embedding model (SmolLM2, Qwen2.5
0.5B/1.5B) but leaves ``lm_head`` on its old weights: the tie is broken by the reload and, on CPU, the head keeps
the GEMM weights it prepacked at start-up, so logprobs drift by nats. :meth:`WeightReloader.agl_reload_weights`
reloads, then ties ``lm_head`` to the embedding again and re-runs its quant method's post-load step.

The module imports nothing from Agent Lightning, so a vLLM install without it can load this file by path (the
backend puts a copy on the server's ``PYTHONPATH`` as ``agl_vllm_worker``).
"""

from __future__ import annotations

from typing import Any


class WeightReloader:
    """Mixed into vLLM's worker class; called through ``POST /collective_rpc`` (needs ``VLLM_SERVER_DEV_MODE=1``)."""

    model_runner: Any  # vLLM's worker provides it, and reload_weights()

    def agl_reload_weights(self, weights_path: str) -> bool:
        """Reload all weights from the ``save_pretrained`` directory ``weights_path``; return whether lm_head was
        re-tied to the input embedding."""
        self.reload_weights(weights_path=weights_path)  # type: ignore[attr-defined]
        model = self.model_runner.get_model()
        head = getattr(model, "lm_head", None)
        embed = getattr(getattr(model, "model", None), "embed_tokens", None)
        config = self.model_runner.model_config.hf_text_config
        tied = bool(getattr(config, "tie_word_embeddings", False)) and head is not None and embed is not None
        if tied:
            assert head is not None and embed is not None
            head.weight = embed.weight
            head.quant_method.process_weights_after_loading(head)
        return tied
