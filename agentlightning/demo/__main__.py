"""``python -m agentlightning.demo``: the command line of the CPU demo (see the package docstring)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from agentlightning.demo import __doc__ as DEMO_DOC
from agentlightning.demo.task import calculator_agent, make_problems


def split_problems(train_size: int, val_size: int, seed: int) -> tuple[list[dict], list[dict]]:
    """Training problems and held-out problems with no question in common."""
    held_out = make_problems(val_size, seed=10_000 + seed)
    seen = {problem["question"] for problem in held_out}
    train = [problem for problem in make_problems(train_size * 2, seed=seed) if problem["question"] not in seen]
    return train[:train_size], held_out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentlightning.demo", description=(DEMO_DOC or "").split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=12, help="training steps (default 12)")
    parser.add_argument("--tasks-per-step", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--val-size", type=int, default=24, help="held-out problems")
    parser.add_argument("--val-every", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=3e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--nworkers", type=int, default=16,
                        help="agents running at once (threads, or worker processes with --server)")
    parser.add_argument("--model", default="smollm2", help="'smollm2' (bundled GGUF), a local path or a hub name")
    parser.add_argument("--output-dir", default="runs/demo")
    parser.add_argument("--server", action="store_true",
                        help="run the agents in worker processes through a Lightning Server and its proxy "
                             "(default: threads of this process calling the backend directly, cheaper on 2 cores)")
    args = parser.parse_args(argv)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("agentlightning.trainers.loop").setLevel(logging.INFO)
    import agentlightning as agl

    train_set, held_out = split_problems(400, args.val_size, args.seed)
    print(f"Agent Lightning demo: {len(train_set)} training problems, {len(held_out)} held-out; "
          f"{args.steps} GRPO steps of {args.tasks_per_step} tasks x {args.group_size} rollouts", flush=True)
    started = time.perf_counter()
    result = agl.train(
        calculator_agent,
        train_set,
        model=args.model,
        group_size=args.group_size,
        tasks_per_step=args.tasks_per_step,
        max_steps=args.steps,
        learning_rate=args.learning_rate,
        lora={"r": 16, "lora_alpha": 32},
        temperature=0.7,
        micro_batch_size=8,
        max_completion_length=40,
        val_dataset=held_out,
        val_every=args.val_every,
        output_dir=Path(args.output_dir),
        use_server=args.server,
        nworkers=args.nworkers,
        seed=args.seed,
        save_model=False,
    )
    minutes = (time.perf_counter() - started) / 60
    before, after = result.initial_validation or {}, result.final_validation or {}
    print(f"\nfinished in {minutes:.1f} min")
    for key, label in (("reward", "held-out mean reward"), ("accuracy", "held-out accuracy   ")):
        print(f"{label}: {before.get(key, float('nan')):.3f} -> {after.get(key, float('nan')):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
