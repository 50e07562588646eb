"""``make demo`` / ``python -m examples.demo``: train SmolLM2-135M-Instruct on CPU to use a calculator.

GRPO with LoRA on arithmetic word problems (:mod:`examples.demo.task`), evaluated on held-out problems
before, during and after training; ``--server`` runs the agents in worker processes through the Lightning Server's
proxy instead of threads. Writes ``reward_curve.png`` and ``metrics.jsonl`` under ``--output-dir``.
"""
