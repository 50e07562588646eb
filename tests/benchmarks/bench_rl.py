"""Benchmark: stored rollouts -> transitions -> advantages -> padded batch, against plain-Python padding.

10,000 transitions of about 1,000 tokens (prompt ~768, completion ~256, with logprobs): 1,250 rollouts of 8 LLM
calls in groups of 8 rollouts per task, stored as JSON lines and loaded back as Rollout records. Timed:

- load: JSON lines -> Rollout records (reported, not part of shaping);
- shaping: ``transitions()`` + ``compute_advantages()`` + ``pack()`` (target: under 2 s), wall-clock and CPU time
  (the CPU time is the steadier figure on a shared machine);
- baseline: the same transitions and advantages, padded with nested Python loops into lists, then tensors.

Both batches are compared element by element. Run with either of:

    python tests/benchmarks/bench_rl.py
    python -m pytest -q -s tests/benchmarks/bench_rl.py
"""

from __future__ import annotations

import gc
import random
import tempfile
import time
from pathlib import Path

import torch

from agentlightning.rl import compute_advantages, pack, transitions
from agentlightning.types import Call, Rollout, Transition

TRANSITIONS = 10_000
CALLS_PER_ROLLOUT = 8
GROUP_SIZE = 8
PROMPT_TOKENS = (640, 896)
COMPLETION_TOKENS = (128, 384)
MAX_PROMPT, MAX_COMPLETION = 1024, 320  # some completions get truncated, as in real runs
PAD = 0


def make_rollouts(seed: int = 0) -> list[Rollout]:
    """Synthetic finished rollouts with server token ids and logprobs."""
    rng = random.Random(seed)
    rollouts = []
    for number in range(TRANSITIONS // CALLS_PER_ROLLOUT):
        task = f"task-{number // GROUP_SIZE}"
        calls = []
        for index in range(CALLS_PER_ROLLOUT):
            completion = [rng.randrange(1, 50_000) for _ in range(rng.randint(*COMPLETION_TOKENS))]
            calls.append(
                Call(
                    call_id=f"c{number}-{index}",
                    sequence=index,
                    role="writer" if index % 2 == 0 else "rewriter",
                    prompt_token_ids=[rng.randrange(1, 50_000) for _ in range(rng.randint(*PROMPT_TOKENS))],
                    completion_token_ids=completion,
                    completion_logprobs=[-rng.random() for _ in completion],
                    token_source="server",
                )
            )
        rollouts.append(
            Rollout(
                rollout_id=f"r{number}",
                task_id=task,
                group_id=task,
                status="succeeded",
                calls=calls,
                final_reward=float(rng.random() < 0.5),
            )
        )
    return rollouts


def naive_pack(rows: list[Transition]) -> dict[str, torch.Tensor]:
    """Plain Python: truncate and pad lists row by row with nested loops, then build tensors."""
    prompts = [row.prompt_token_ids[-MAX_PROMPT:] for row in rows]
    completions = [row.completion_token_ids[:MAX_COMPLETION] for row in rows]
    logprobs = [row.completion_logprobs[:MAX_COMPLETION] for row in rows]  # type: ignore[index]
    width_p = max(len(p) for p in prompts)
    width_c = max(len(c) for c in completions)
    prompt_ids, prompt_mask, completion_ids, completion_mask, old_logprobs = [], [], [], [], []
    for prompt, completion, values in zip(prompts, completions, logprobs, strict=True):
        ids, mask = [], []
        for _ in range(width_p - len(prompt)):
            ids.append(PAD)
            mask.append(0)
        for token in prompt:
            ids.append(token)
            mask.append(1)
        prompt_ids.append(ids)
        prompt_mask.append(mask)
        ids, mask, lps = [], [], []
        for token, value in zip(completion, values, strict=True):
            ids.append(token)
            mask.append(1)
            lps.append(value)
        for _ in range(width_c - len(completion)):
            ids.append(PAD)
            mask.append(0)
            lps.append(0.0)
        completion_ids.append(ids)
        completion_mask.append(mask)
        old_logprobs.append(lps)
    return {
        "prompt_ids": torch.tensor(prompt_ids, dtype=torch.long),
        "prompt_mask": torch.tensor(prompt_mask, dtype=torch.long),
        "completion_ids": torch.tensor(completion_ids, dtype=torch.long),
        "completion_mask": torch.tensor(completion_mask, dtype=torch.long),
        "old_logprobs": torch.tensor(old_logprobs, dtype=torch.float32),
        "advantages": torch.tensor([row.advantage for row in rows], dtype=torch.float32),
        "weights": torch.tensor([row.weight for row in rows], dtype=torch.float32),
    }


def run_benchmark() -> dict[str, float]:
    """Run once and print the figures; returns them."""
    with tempfile.TemporaryDirectory() as folder:
        store = Path(folder) / "rollouts.jsonl"
        with store.open("w") as handle:
            for rollout in make_rollouts():
                handle.write(rollout.model_dump_json() + "\n")
        gc.collect()
        start = time.perf_counter()
        with store.open() as handle:
            rollouts = [Rollout.model_validate_json(line) for line in handle]
        load = time.perf_counter() - start

    gc.collect()
    cpu = time.process_time()
    start = time.perf_counter()
    rows = compute_advantages(transitions(rollouts), "grpo")
    extract = time.perf_counter() - start
    start = time.perf_counter()
    batch = pack(rows, PAD, max_prompt_length=MAX_PROMPT, max_completion_length=MAX_COMPLETION)
    packing = time.perf_counter() - start
    shaping = extract + packing
    shaping_cpu = time.process_time() - cpu

    gc.collect()
    start = time.perf_counter()
    reference = naive_pack(rows)
    baseline = time.perf_counter() - start

    for name, tensor in reference.items():
        assert torch.equal(getattr(batch, name), tensor), f"{name} differs from the plain-Python baseline"
    tokens = batch.stats.prompt_tokens + batch.stats.completion_tokens
    figures = {
        "transitions": len(rows),
        "tokens": tokens,
        "load_s": load,
        "extract_and_advantages_s": extract,
        "pack_s": packing,
        "shaping_s": shaping,
        "shaping_cpu_s": shaping_cpu,
        "transitions_per_s": len(rows) / shaping,
        "baseline_pack_s": baseline,
        "pack_speedup": baseline / packing,
        "pipeline_speedup": (extract + baseline) / shaping,
    }
    print(
        f"\nbench_rl: {len(rows)} transitions, {tokens / len(rows):.0f} tokens each on average "
        f"({batch.stats.completions_truncated} completions truncated), batch {tuple(batch.prompt_ids.shape)} + "
        f"{tuple(batch.completion_ids.shape)}\n"
        f"  load JSON -> Rollout records:          {load:6.2f} s (not part of shaping)\n"
        f"  transitions + GRPO advantages:          {extract:6.2f} s\n"
        f"  pack (vectorised):                      {packing:6.2f} s\n"
        f"  shaping total:                          {shaping:6.2f} s = {len(rows) / shaping:,.0f} transitions/s "
        f"(target < 2 s; {shaping_cpu:.2f} s of CPU time)\n"
        f"  baseline pack (nested Python loops):    {baseline:6.2f} s\n"
        f"  pack speed-up over baseline:            {baseline / packing:6.1f}x; whole shaping "
        f"{(extract + baseline) / shaping:.1f}x"
    )
    return figures


def test_bench_rl() -> None:
    figures = run_benchmark()
    assert figures["transitions"] == TRANSITIONS


if __name__ == "__main__":
    run_benchmark()
