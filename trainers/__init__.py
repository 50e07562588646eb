"""Heavy ML: the GRPO trainer on TRL and the model backends (Hugging Face in-process, vLLM)."""
