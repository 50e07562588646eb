"""The in-process Hugging Face backend: an OpenAI-compatible server over the trainer's live weights, its batched
sampler, CPU attention and tool-call parsing."""
