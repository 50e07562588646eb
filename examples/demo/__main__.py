"""``python -m examples.demo``: the command line of the CPU demo (see the package docstring)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from examples.demo import __doc__ as DEMO_DOC
from examples.demo.task import calculator_agent, interleave_kinds, make_problems

VLLM_ON_CPU = {"dtype": "float32", "env": {"VLLM_CPU_KVCACHE_SPACE": "4"}}
"""``--backend vllm``'s server options: float32 (vLLM's CPU build then samples what the trainer scores, to ~1e-6
nats) and 4 GiB of KV cache; ignored by the HF backend."""


def split_problems(train_size: int, val_size: int, seed: int) -> tuple[list[dict], list[dict]]:
    """Training problems (their kinds interleaved) and held-out problems, with no question in common."""
    held_out = make_problems(val_size, seed=10_000 + seed)
    seen = {problem["question"] for problem in held_out}
    train = [problem for problem in make_problems(train_size * 2, seed=seed) if problem["question"] not in seen]
    return interleave_kinds(train[:train_size]), held_out


def time_to_accuracy(history: list[dict], target: float) -> tuple[int, float, float] | None:
    """(step, seconds without / with the held-out evaluations) from the first evaluation to the first reaching
    ``target``."""
    evaluated = [row for row in history if "val/accuracy" in row and "elapsed_seconds" in row]
    for index, row in enumerate(evaluated[1:], start=1):
        if row["val/accuracy"] >= target:
            total = row["elapsed_seconds"] - evaluated[0]["elapsed_seconds"]
            return int(row["step"]), total - sum(r.get("val_seconds", 0.0) for r in evaluated[1 : index + 1]), total
    return None


def print_steps(history: list[dict], target: float) -> None:
    """One line per step (its time, the time since training began, rewards, held-out accuracy), then the time to
    ``target`` held-out accuracy."""
    start = next((row["elapsed_seconds"] for row in history if row["step"] == 0), 0.0)
    print(f"\nset-up and the held-out evaluation before training: {start:.0f} s")
    for row in history[1:]:
        seconds = f"{row['step_seconds']:5.1f} s" if "step_seconds" in row else "skipped"  # no reward variance
        line = (
            f"step {row['step']:>2}  {seconds}  "
            f"elapsed {row['elapsed_seconds'] - start:5.0f} s  train reward {row.get('reward', 0):.2f}"
        )
        if "val/accuracy" in row:
            line += f"  held-out accuracy {row['val/accuracy']:.3f} (evaluated in {row.get('val_seconds', 0):.0f} s)"
        print(line)
    reached = time_to_accuracy(history, target)
    print(
        f"held-out accuracy >= {target}: "
        + (
            f"step {reached[0]}, training wall time {reached[1] / 60:.2f} min "
            f"({reached[2] / 60:.2f} min with the evaluations)"
            if reached
            else "not reached"
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.demo", description=(DEMO_DOC or "").split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=16, help="training steps (default 16)")
    parser.add_argument(
        "--tasks-per-step",
        type=int,
        default=6,
        help="problems per step (default 6: two of each kind, see --shuffle-tasks)",
    )
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--val-size", type=int, default=24, help="held-out problems")
    parser.add_argument("--val-every", type=int, default=2)
    parser.add_argument("--learning-rate", type=float, default=3e-4)
    parser.add_argument(
        "--algorithm",
        default="dr_grpo",
        help="advantage estimator (agl.train's algorithm=; default dr_grpo: a group's advantages are "
        "not divided by its std, so a 0.1-vs-0 format difference weighs less than a right answer)",
    )
    parser.add_argument(
        "--temperature",
        type=float,
        default=0.5,
        help="sampling temperature of training rollouts (default 0.5: the untrained model makes more "
        "right calculator calls than at 0.7, so the first steps have a signal; docs/training.md)",
    )
    parser.add_argument(
        "--shuffle-tasks",
        action="store_true",
        help="draw each step's problems at random (default: in an order that cycles through the three "
        "kinds of problem, so every step sees each kind)",
    )
    parser.add_argument(
        "--dynamic-sampling",
        type=int,
        default=None,
        help="tasks a step may add to replace groups whose rewards all tie (DAPO's dynamic sampling; "
        "default: --tasks-per-step when asynchronous, else 0)",
    )
    parser.add_argument(
        "--max-staleness",
        type=int,
        default=0,
        help="asynchronous training: the next K steps' rollouts run while a step trains (default 0)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--nworkers", type=int, default=32, help="agents running at once (threads, or worker processes with --server)"
    )
    parser.add_argument("--model", default="smollm2", help="'smollm2' (bundled GGUF), a local path or a hub name")
    parser.add_argument("--output-dir", default="runs/demo", help="replaced by each run of the demo")
    parser.add_argument("--target", type=float, default=0.9, help="held-out accuracy to stop at, timed")
    parser.add_argument("--all-steps", action="store_true", help="keep training after reaching --target")
    parser.add_argument(
        "--server",
        action="store_true",
        help="run the agents in worker processes through a Lightning Server and its proxy "
        "(default: threads of this process calling the backend directly, cheaper on 2 cores)",
    )
    parser.add_argument(
        "--backend",
        choices=["hf", "vllm"],
        default="hf",
        help="what serves the model: 'hf' (in-process Hugging Face backend, default) or 'vllm' (a vLLM server "
        "started by the run, LoRA adapters hot-loaded after each update; on CPU `make vllm-venv` first; implies "
        "--server)",
    )
    args = parser.parse_args(argv)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("agentlightning.trainers.loop").setLevel(logging.INFO)
    import agentlightning as agl

    train_set, held_out = split_problems(400, args.val_size, args.seed)
    print(
        f"Agent Lightning demo: {len(train_set)} training problems, {len(held_out)} held-out; "
        f"{args.steps} {args.algorithm} steps of {args.tasks_per_step} tasks x {args.group_size} rollouts",
        flush=True,
    )
    started = time.perf_counter()
    result = agl.train(
        calculator_agent,
        train_set,
        model=args.model,
        group_size=args.group_size,
        tasks_per_step=args.tasks_per_step,
        max_steps=args.steps,
        shuffle_dataset=args.shuffle_tasks,
        algorithm=args.algorithm,
        learning_rate=args.learning_rate,
        lora={"r": 16, "lora_alpha": 32},
        dynamic_sampling=args.dynamic_sampling,
        max_staleness=args.max_staleness,
        stop_accuracy=None if args.all_steps else args.target,
        temperature=args.temperature,
        micro_batch_size=16,
        max_completion_length=40,
        val_dataset=held_out,
        val_every=args.val_every,
        output_dir=Path(args.output_dir),
        overwrite=True,  # `make demo` again replaces the last demo run
        use_server=args.server or args.backend == "vllm",
        backend=args.backend,
        vllm=VLLM_ON_CPU,
        nworkers=args.nworkers,
        seed=args.seed,
        save_model=False,
    )
    minutes = (time.perf_counter() - started) / 60
    before, after = result.initial_validation or {}, result.final_validation or {}
    print_steps(result.history, args.target)
    print(f"finished in {minutes:.1f} min; curve: {result.curve_path}")
    for key, label in (("reward", "held-out mean reward"), ("accuracy", "held-out accuracy   ")):
        print(f"{label}: {before.get(key, float('nan')):.3f} -> {after.get(key, float('nan')):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
