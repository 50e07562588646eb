"""The vLLM backend: a vLLM OpenAI server kept in sync with the trainer's weights, and the worker extension it
loads."""
