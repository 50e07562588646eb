"""Benchmark: the trainer's overhead against plain TRL, and the HF backend's batching.

1. One GRPO step on identical rows (16 rows, prompt 96 tokens, completion 48, groups of 4) through
   ``LightningGRPOTrainer.step`` vs a plain ``trl.GRPOTrainer.train()`` step fed the same rows by a
   ``rollout_func`` (no generation cost on either side; TRL computes the same group advantages from the same
   rewards). Target: ours / plain <= 1.1, median of the steps after a warm-up step.
2. HF backend generation throughput (completion tokens/s) for 16 chat requests sent at once (batched) vs one at
   a time, through the real openai client.

Model: a random Llama (hidden 256, 4 layers) by default; ``AGL_BENCH_MODEL=smollm2`` uses SmolLM2-135M. CPU time is
reported next to wall time (the steadier figure on a shared machine). Run with either of:

    python tests/benchmarks/bench_trainer.py
    python -m pytest -q -s tests/benchmarks/bench_trainer.py
"""

from __future__ import annotations

import concurrent.futures
import copy
import os
import random
import statistics
import tempfile
import time

import torch

ROWS, GROUP, PROMPT, COMPLETION, STEPS = 16, 4, 96, 48, 4


def _model():
    from agentlightning.trainers.models import load_model, tiny_model

    if os.environ.get("AGL_BENCH_MODEL") == "smollm2":
        return load_model("smollm2")
    return tiny_model(seed=0, hidden_size=256, num_layers=4)


def _rows(vocab: int) -> tuple[list[list[int]], list[list[int]], list[float]]:
    rng = random.Random(0)
    prompts = [[rng.randrange(3, vocab) for _ in range(PROMPT - rng.randrange(0, 16))] for _ in range(ROWS // GROUP)]
    prompts = [prompt for prompt in prompts for _ in range(GROUP)]
    completions = [[rng.randrange(3, vocab) for _ in range(COMPLETION - rng.randrange(0, 16))] for _ in range(ROWS)]
    rewards = [float(rng.random() < 0.5) for _ in range(ROWS)]
    return prompts, completions, rewards


def _config(output_dir: str, **extra):
    from agentlightning.trainers.learner.grpo import grpo_config

    return grpo_config(output_dir, micro_batch_size=ROWS, learning_rate=1e-4, max_steps=STEPS + 1, **extra)


def bench_training_step() -> dict[str, float]:
    from agentlightning.trainers.learner.batch import pack
    from agentlightning.trainers.learner.grpo import LightningGRPOTrainer
    from datasets import Dataset
    from trl import GRPOTrainer

    from agentlightning.rl.advantages import compute_advantages
    from agentlightning.types import Transition

    model, tokenizer = _model()
    prompts, completions, rewards = _rows(len(tokenizer))

    # -- plain TRL: train() with a rollout_func returning the same rows ------------------------------------
    def rollout_func(batch_prompts, trainer):
        assert ROWS % len(batch_prompts) == 0
        return {"prompt_ids": prompts, "completion_ids": completions, "logprobs": None, "fixed_reward": rewards}

    def fixed_reward(completions, fixed_reward, **kwargs):  # noqa: ARG001 - TRL's reward-function signature
        return list(fixed_reward)

    plain_times: list[float] = []

    from transformers import TrainerCallback

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            plain_times.append(time.perf_counter() - self.started)

    plain_model = copy.deepcopy(model)
    dataset = Dataset.from_dict({"prompt": [f"task {i}" for i in range(ROWS * (STEPS + 1))]})
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
        plain = GRPOTrainer(
            model=plain_model,
            reward_funcs=fixed_reward,
            train_dataset=dataset,
            processing_class=tokenizer,
            rollout_func=rollout_func,
            callbacks=[Timer()],
            args=_config(tmp, num_generations=GROUP, shuffle_dataset=False),
        )
        plain.train()

    # -- ours: the same rows as a LightningRL batch ---------------------------------------------------------------
    transitions = [
        Transition(
            rollout_id=f"r{i}",
            group_id=f"g{i // GROUP}",
            index=0,
            prompt_token_ids=prompts[i],
            completion_token_ids=completions[i],
            reward=rewards[i],
        )
        for i in range(ROWS)
    ]
    compute_advantages(transitions, "grpo")
    batch = pack(transitions, tokenizer.pad_token_id)
    ours_times: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        ours = LightningGRPOTrainer(copy.deepcopy(model), _config(tmp), tokenizer)
        for _ in range(STEPS + 1):
            started = time.perf_counter()
            ours.step(batch)
            ours_times.append(time.perf_counter() - started)
    plain_step = statistics.median(plain_times[1:])
    ours_step = statistics.median(ours_times[1:])
    return {"plain_step_s": plain_step, "ours_step_s": ours_step, "ratio": ours_step / plain_step}


def bench_backend(requests: int = 16, max_tokens: int = 32) -> dict[str, float]:
    import openai
    from agentlightning.trainers.backends.hf.server import HFBackendServer

    model, tokenizer = _model()
    model.eval()
    messages = [[{"role": "user", "content": f"Question {i}: what is {i} plus {i * 3}?"}] for i in range(requests)]
    with HFBackendServer(model, tokenizer, max_batch_size=requests, batch_wait_s=0.02) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)

        def ask(conversation):
            reply = client.chat.completions.create(
                model="policy",
                messages=conversation,
                max_tokens=max_tokens,
                temperature=1.0,
                seed=1,
                stop=None,
            ).model_dump()
            return len(reply["choices"][0]["token_ids"])

        ask(messages[0])  # warm-up
        started, cpu = time.perf_counter(), time.process_time()
        sequential_tokens = sum(ask(conversation) for conversation in messages)
        sequential = time.perf_counter() - started
        sequential_cpu = time.process_time() - cpu
        started, cpu = time.perf_counter(), time.process_time()
        with concurrent.futures.ThreadPoolExecutor(requests) as pool:
            batched_tokens = sum(pool.map(ask, messages))
        batched = time.perf_counter() - started
        batched_cpu = time.process_time() - cpu
    return {
        "sequential_tok_s": sequential_tokens / sequential,
        "batched_tok_s": batched_tokens / batched,
        "speedup": (batched_tokens / batched) / (sequential_tokens / sequential),
        "cpu_speedup": (batched_tokens / batched_cpu) / (sequential_tokens / sequential_cpu),
    }


def test_bench_trainer() -> None:
    torch.manual_seed(0)
    step = bench_training_step()
    print(
        f"\ntraining step on {ROWS} identical rows: plain GRPOTrainer {step['plain_step_s'] * 1000:.0f} ms, "
        f"LightningGRPOTrainer {step['ours_step_s'] * 1000:.0f} ms -> ratio {step['ratio']:.2f} (target <= 1.1)"
    )
    backend = bench_backend()
    print(
        f"HF backend, 16 requests x 32 tokens: one at a time {backend['sequential_tok_s']:.0f} tok/s, batched "
        f"{backend['batched_tok_s']:.0f} tok/s -> {backend['speedup']:.1f}x wall "
        f"({backend['cpu_speedup']:.1f}x per CPU s)"
    )
    assert step["ratio"] <= 1.5, "the LightningRL path must not add meaningful overhead to TRL's step"
    assert backend["speedup"] > 1.0


if __name__ == "__main__":
    test_bench_trainer()
