"""Benchmark: synchronous vs asynchronous training (``max_staleness=1``) on the demo task with a slow environment.

The demo's calculator agent (SmolLM2-135M-Instruct, LoRA, GRPO) whose every rollout also waits on an environment
step of 0.5-2 s (uniform), as a tool call, SQL execution or retrieval would. Both modes run the same seeds, the
same number of updates and the same tasks per step (dynamic sampling off in both), one after the other in one
process (side by side on the same machine, so their ratio is what to read on a shared machine). Reported per
seed: the mean wall time of a training step (rollouts waited for + update; validation excluded), its ratio
sync / async, the held-out reward and accuracy before and after (greedy), and the asynchronous run's staleness,
dropped transitions and waits.

    python tests/benchmarks/bench_async.py                     # 3 seeds, 3 steps of 2 tasks x 4 rollouts
    python tests/benchmarks/bench_async.py --seeds 0 --steps 6
    AGL_BENCH_MODEL=tiny python tests/benchmarks/bench_async.py  # a random tiny model: the plumbing only
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the examples package, when run as a script
os.environ.setdefault("OMP_NUM_THREADS", "1")  # spinning OpenMP threads on a shared 2-core machine stall torch

import agentlightning as agl  # noqa: E402 - after the thread setting
from examples.demo.__main__ import split_problems  # noqa: E402
from examples.demo.task import calculator_agent  # noqa: E402

ENV_SECONDS = (0.5, 2.0)


@agl.rollout
def slow_calculator_agent(task: dict[str, Any], llm: agl.LLM) -> float:
    """The demo agent, then an environment step of 0.5-2 s (the agent's tool/environment latency)."""
    reward = calculator_agent(task, llm)
    time.sleep(random.uniform(*ENV_SECONDS))
    return reward


def run_one(seed: int, staleness: int, steps: int, tasks_per_step: int, group_size: int, val_size: int,
            output_dir: Path) -> dict[str, Any]:
    train_set, held_out = split_problems(200, val_size, seed)
    if os.environ.get("AGL_BENCH_MODEL") == "tiny":
        from agentlightning.trainers.models import tiny_model

        model, tokenizer = tiny_model(seed=seed)
        model_options: dict[str, Any] = {"model": model, "tokenizer": tokenizer}
    else:
        model_options = {"model": "smollm2"}
    started = time.perf_counter()
    result = agl.train(
        slow_calculator_agent, train_set, **model_options, group_size=group_size, tasks_per_step=tasks_per_step,
        max_steps=steps, learning_rate=3e-4, lora={"r": 16, "lora_alpha": 32}, temperature=0.7, micro_batch_size=8,
        max_completion_length=40, val_dataset=held_out, val_every=0, output_dir=output_dir, use_server=False,
        nworkers=2 * tasks_per_step * group_size, seed=seed, save_model=False, progress=False,
        max_staleness=staleness, dynamic_sampling=0,  # the same tasks per step in both modes: overlap only
        rollout_timeout=None,  # a loaded machine makes rollouts slow, not wrong
    )
    rows = [row for row in result.history if row.get("step", 0) > 0]
    step_seconds = [row["step_seconds"] if "step_seconds" in row else row["rollout_seconds"] for row in rows]
    before, after = result.initial_validation or {}, result.final_validation or {}
    return {
        "seed": seed, "max_staleness": staleness, "updates": sum(1 for row in rows if not row.get("skipped_update")),
        "step_seconds": statistics.fmean(step_seconds), "wall_seconds": time.perf_counter() - started,
        "reward_before": before.get("reward"), "reward_after": after.get("reward"),
        "accuracy_before": before.get("accuracy"), "accuracy_after": after.get("accuracy"),
        "staleness_mean": statistics.fmean(row.get("async/staleness_mean", 0.0) for row in rows),
        "staleness_max": max(row.get("async/staleness_max", 0.0) for row in rows),
        "dropped_stale": sum(row.get("async/dropped_stale", 0.0) for row in rows),
        "refills": sum(row.get("async/refills", 0.0) for row in rows),
        "trainer_wait": sum(row.get("async/trainer_wait_seconds", 0.0) for row in rows),
        "sampler_wait": sum(row.get("async/sampler_wait_seconds", 0.0) for row in rows),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--tasks-per-step", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--val-size", type=int, default=8)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        for seed in args.seeds:
            pair = []
            for staleness in (0, 1):
                outcome = run_one(seed, staleness, args.steps, args.tasks_per_step, args.group_size, args.val_size,
                                  Path(scratch) / f"s{seed}-k{staleness}")
                print(json.dumps(outcome), flush=True)
                pair.append(outcome)
            results.append(pair)
    print(f"\n{'seed':>4} {'sync s/step':>11} {'async s/step':>12} {'ratio':>6}   held-out reward (acc): "
          "before -> sync | async   async: lag mean/max, dropped, trainer/sampler wait s")
    for sync, asyn in results:
        print(f"{sync['seed']:>4} {sync['step_seconds']:>11.1f} {asyn['step_seconds']:>12.1f} "
              f"{sync['step_seconds'] / asyn['step_seconds']:>5.2f}x   {sync['reward_before']:.3f} "
              f"({sync['accuracy_before']:.2f}) -> {sync['reward_after']:.3f} ({sync['accuracy_after']:.2f}) | "
              f"{asyn['reward_after']:.3f} ({asyn['accuracy_after']:.2f})   {asyn['staleness_mean']:.2f}/"
              f"{asyn['staleness_max']:.0f}, {asyn['dropped_stale']:.0f}, {asyn['trainer_wait']:.0f}/"
              f"{asyn['sampler_wait']:.0f}")
    ratios = [sync["step_seconds"] / asyn["step_seconds"] for sync, asyn in results]
    per_seed = [round(ratio, 2) for ratio in ratios]
    print(f"sync / async wall time per step: {statistics.fmean(ratios):.2f}x (per seed {per_seed})")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1), encoding="utf-8")
    return 0


def test_async_benchmark_tiny() -> None:
    """The benchmark's plumbing on a random tiny model (``pytest tests/benchmarks/bench_async.py``)."""
    os.environ["AGL_BENCH_MODEL"] = "tiny"
    assert main(["--seeds", "0", "--steps", "2", "--val-size", "4"]) == 0


if __name__ == "__main__":
    sys.exit(main())
