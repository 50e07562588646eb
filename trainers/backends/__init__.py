"""Model backends behind the Lightning proxy: the :class:`~agentlightning.trainers.backends.base.Backend` protocol,
the in-process Hugging Face backend (:mod:`~agentlightning.trainers.backends.hf`) and vLLM
(:mod:`~agentlightning.trainers.backends.vllm`)."""
