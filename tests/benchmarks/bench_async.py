"""Benchmark: synchronous vs asynchronous training (``max_staleness=1``) on the demo task with a slow environment.

The demo's calculator agent (SmolLM2-135M-Instruct, LoRA, GRPO) whose every rollout also waits on an environment
step of 0.5-2 s (uniform), as a tool call, SQL execution or retrieval would. Both modes run the same seeds, the
same number of updates and the same dynamic sampling (a group whose rewards all tie is replaced by up to
``--dynamic-sampling`` new tasks a step, so that steps rarely skip their update), one after the other in one
process (side by side on the same machine: read their ratios; the order alternates between seeds so a drift in the
machine's load does not favour one mode). A training step's wall time is the rollouts it waited for plus its
update (validation excluded). Reported per seed and mode:

- steady: the median time of the steps after the first that updated the model. The first asynchronous step cannot
  overlap anything (its rollouts are the pipeline's fill), so with few steps the run's total understates what
  overlapping gives; a step that skipped its update (every group tied, refills spent) is left out, since
  asynchronous it takes almost no time;
- total: the sum of all step times (the fill and skipped updates included), the run's training wall time;
- the held-out reward and accuracy before and after (greedy), the mean update time (the asynchronous one shares the
  CPU with generation), the rollouts a step ran (dynamic sampling's refills included), and the asynchronous run's
  staleness, dropped transitions and waits; the load average before and after each run.

    python tests/benchmarks/bench_async.py                     # 3 seeds, 6 steps of 2 tasks x 4 rollouts
    python tests/benchmarks/bench_async.py --seeds 0 --steps 8
    python tests/benchmarks/bench_async.py --tasks-per-step 4 --val-size 24 --sync-threads 2 --async-threads 2
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
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the demo: idle OpenMP threads sleep instead of spinning

import torch  # noqa: E402 - after the OpenMP setting

import agentlightning as agl  # noqa: E402
from examples.demo.__main__ import split_problems  # noqa: E402
from examples.demo.task import calculator_agent  # noqa: E402

ENV_SECONDS = (0.5, 2.0)


@agl.rollout
def slow_calculator_agent(task: dict[str, Any], llm: agl.LLM) -> float:
    """The demo agent, then an environment step of 0.5-2 s (the agent's tool/environment latency)."""
    reward = calculator_agent(task, llm)
    time.sleep(random.uniform(*ENV_SECONDS))
    return reward


def run_one(
    seed: int,
    staleness: int,
    steps: int,
    tasks_per_step: int,
    group_size: int,
    val_size: int,
    dynamic_sampling: int,
    threads: int,
    output_dir: Path,
) -> dict[str, Any]:
    torch.set_num_threads(threads)
    train_set, held_out = split_problems(200, val_size, seed)
    if os.environ.get("AGL_BENCH_MODEL") == "tiny":
        from agentlightning.trainers.models import tiny_model

        model, tokenizer = tiny_model(seed=seed)
        model_options: dict[str, Any] = {"model": model, "tokenizer": tokenizer}
    else:
        model_options = {"model": "smollm2"}
    loaded, started = round(os.getloadavg()[0], 2), time.perf_counter()
    result = agl.train(
        slow_calculator_agent,
        train_set,
        **model_options,
        group_size=group_size,
        tasks_per_step=tasks_per_step,
        max_steps=steps,
        learning_rate=3e-4,
        lora={"r": 16, "lora_alpha": 32},
        temperature=0.7,
        micro_batch_size=8,
        max_completion_length=40,
        val_dataset=held_out,
        val_every=0,
        output_dir=output_dir,
        use_server=False,
        nworkers=(2 * tasks_per_step + dynamic_sampling) * group_size,
        seed=seed,
        save_model=False,
        progress=False,
        max_staleness=staleness,
        dynamic_sampling=dynamic_sampling,  # the same cap in both modes
        rollout_timeout=None,  # a loaded machine makes rollouts slow, not wrong
    )
    rows = [row for row in result.history if row.get("step", 0) > 0]
    step_seconds = [row["step_seconds"] if "step_seconds" in row else row["rollout_seconds"] for row in rows]
    updated = [
        seconds
        for index, (row, seconds) in enumerate(zip(rows, step_seconds, strict=True))
        if index > 0 and not row.get("skipped_update")
    ]
    before, after = result.initial_validation or {}, result.final_validation or {}
    return {
        "seed": seed,
        "max_staleness": staleness,
        "threads": threads,
        "updates": sum(1 for row in rows if not row.get("skipped_update")),
        "steady_seconds": statistics.median(updated or step_seconds),
        "total_seconds": sum(step_seconds),
        "step_seconds": [round(value, 2) for value in step_seconds],
        "wall_seconds": time.perf_counter() - started,
        "update_seconds": statistics.fmean(
            [row["train/update_seconds"] for row in rows if "train/update_seconds" in row] or [0.0]
        ),
        "pause_seconds": sum(row.get("async/pause_seconds", 0.0) for row in rows),
        "load_average": [loaded, round(os.getloadavg()[0], 2)],
        "reward_before": before.get("reward"),
        "reward_after": after.get("reward"),
        "accuracy_before": before.get("accuracy"),
        "accuracy_after": after.get("accuracy"),
        "staleness_mean": statistics.fmean(row.get("async/staleness_mean", 0.0) for row in rows),
        "staleness_max": max(row.get("async/staleness_max", 0.0) for row in rows),
        "dropped_stale": sum(row.get("async/dropped_stale", 0.0) for row in rows),
        "refills": sum(row.get("async/refills", 0.0) for row in rows),
        "rollouts_per_step": statistics.fmean(row.get("rollouts", 0.0) for row in rows),
        "trainer_wait": sum(row.get("async/trainer_wait_seconds", 0.0) for row in rows),
        "sampler_wait": sum(row.get("async/sampler_wait_seconds", 0.0) for row in rows),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--tasks-per-step", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--val-size", type=int, default=8)
    parser.add_argument(
        "--dynamic-sampling",
        type=int,
        default=4,
        help="tasks a step may sample to replace groups whose rewards all tie, in both modes (0: "
        "such a step skips its update)",
    )
    parser.add_argument("--sync-threads", type=int, default=1, help="torch threads of the synchronous runs")
    parser.add_argument(
        "--async-threads",
        type=int,
        default=1,
        help="torch threads of the asynchronous runs (generation and update run at once)",
    )
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        for turn, seed in enumerate(args.seeds):
            pair = {}
            for staleness in (0, 1) if turn % 2 == 0 else (1, 0):
                threads = args.async_threads if staleness else args.sync_threads
                pair[staleness] = run_one(
                    seed,
                    staleness,
                    args.steps,
                    args.tasks_per_step,
                    args.group_size,
                    args.val_size,
                    args.dynamic_sampling,
                    threads,
                    Path(scratch) / f"{seed}-{staleness}",
                )
                print(json.dumps(pair[staleness]), flush=True)
            results.append((pair[0], pair[1]))
    print(
        f"\n{'seed':>4} {'mode':>5} {'threads':>7} {'steady s':>8} {'total s':>7} {'updates':>7} {'rollouts':>8} "
        f"{'update s':>8} "
        f"{'held-out reward (acc) before -> after':>37} {'lag':>7} {'dropped':>7} {'wait s trainer/sampler':>22}"
    )
    for pair in results:
        for run in pair:
            print(
                f"{run['seed']:>4} {'async' if run['max_staleness'] else 'sync':>5} {run['threads']:>7} "
                f"{run['steady_seconds']:>8.1f} {run['total_seconds']:>7.0f} {run['updates']:>7} "
                f"{run['rollouts_per_step']:>8.1f} {run['update_seconds']:>8.1f} "
                f"{run['reward_before']:>14.3f} ({run['accuracy_before']:.2f}) -> "
                f"{run['reward_after']:.3f} ({run['accuracy_after']:.2f}) {run['staleness_mean']:>3.2f}/"
                f"{run['staleness_max']:.0f} {run['dropped_stale']:>7.0f} "
                f"{run['trainer_wait']:>14.0f}/{run['sampler_wait']:<7.0f}"
            )
    for name in ("steady", "total"):
        ratios = [sync[f"{name}_seconds"] / asyn[f"{name}_seconds"] for sync, asyn in results]
        print(
            f"sync / async, {name} wall time per step: {statistics.fmean(ratios):.2f}x "
            f"(per seed {[round(ratio, 2) for ratio in ratios]})"
        )
    loads = [load for pair in results for run in pair for load in run["load_average"]]
    print(f"load average (1 min) around the runs: {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} CPUs")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1), encoding="utf-8")
    return 0


def test_async_benchmark_tiny() -> None:
    """The benchmark's plumbing on a random tiny model (``pytest tests/benchmarks/bench_async.py``)."""
    os.environ["AGL_BENCH_MODEL"] = "tiny"
    assert main(["--seeds", "0", "--steps", "2", "--val-size", "4"]) == 0


if __name__ == "__main__":
    sys.exit(main())
