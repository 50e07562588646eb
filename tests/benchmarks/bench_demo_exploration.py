"""Benchmark: how much learning signal the demo's first step gets, per sampling temperature.

GRPO learns only from groups whose rewards differ, so the first steps of ``make demo`` depend on how often the
untrained SmolLM2-135M, sampled at the training temperature, makes the calculator call that scores 1.0. This runs
the demo's own agent (``examples/demo/task.py``, through ``agl.run`` and the in-process HF backend that
``agl.train`` uses, the temperature forced by the backend as in training) ``--samples`` times on each of
``--problems`` held-out problems, per temperature, and prints per problem kind (``+`` "gets more", ``-`` "gives
away", ``*`` "boxes") the share of rollouts by reward (1.0 right call, 0.3 right text answer, 0.1 well-formed wrong
call, 0 anything else), and the share of groups of ``--group-size`` rollouts of one problem whose rewards all tie
(no GRPO signal), each against the first temperature listed (the baseline, measured in the same run).

    python tests/benchmarks/bench_demo_exploration.py [--temperatures 0.7 0.5] [--problems 12] [--samples 16]
    python -m pytest -q -s tests/benchmarks/bench_demo_exploration.py
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the examples package, when run as a script

REWARDS = (1.0, 0.3, 0.1, 0.0)


def ratio(value: float, baseline: float) -> str:
    """``value`` against ``baseline`` as ``x1.23`` (a baseline of 0 has no ratio)."""
    return f"x{value / baseline:.2f}" if baseline else "(baseline 0)"


def measure(
    temperature: float, problems: list[dict[str, Any]], samples: int, group_size: int, backend: Any
) -> dict[str, Any]:
    """Rewards of ``samples`` rollouts per problem at ``temperature``: shares per kind and the tied-group share."""
    import agentlightning as agl
    from examples.demo.task import calculator_agent

    backend.sampling_overrides = {"temperature": temperature}
    tasks = [{**problem, "id": f"{problem['id']}-{index}"} for problem in problems for index in range(samples)]
    started = time.perf_counter()
    rollouts = agl.run(
        calculator_agent, tasks, llm=agl.LLM(base_url=backend.base_url, model="smollm2"), n_workers=32, timeout=600
    )
    seconds = time.perf_counter() - started
    by_problem: dict[str, list[float]] = collections.defaultdict(list)
    shares: dict[str, collections.Counter[float]] = collections.defaultdict(collections.Counter)
    for task, rollout in zip(tasks, rollouts, strict=True):
        reward = rollout.final_reward if rollout.final_reward is not None else 0.0
        by_problem[task["question"]].append(reward)
        shares[task["op"]][reward] += 1
    groups = tied = 0
    for rewards in by_problem.values():
        for start in range(0, len(rewards) - group_size + 1, group_size):
            groups += 1
            tied += len(set(rewards[start : start + group_size])) == 1
    right = sum(counter[1.0] for counter in shares.values()) / len(tasks)
    return {
        "shares": {
            kind: {reward: counter[reward] / sum(counter.values()) for reward in REWARDS}
            for kind, counter in shares.items()
        },
        "right": right,
        "tied": tied / groups if groups else float("nan"),
        "seconds": seconds,
    }


def bench(temperatures: list[float], problems: int = 12, samples: int = 16, group_size: int = 4) -> str:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from agentlightning.trainers.backends.hf.server import HFBackendServer
    from agentlightning.trainers.models import load_model

    from examples.demo.task import make_problems

    torch.manual_seed(0)
    model, tokenizer = load_model("smollm2")
    held_out = make_problems(problems, seed=10_000)  # the demo's held-out generator (seed 0)
    with HFBackendServer(model, tokenizer, model_name="smollm2", default_max_tokens=40) as backend:
        results = {t: measure(t, held_out, samples, group_size, backend) for t in temperatures}
    base = results[temperatures[0]]
    lines = [
        f"{len(held_out)} held-out problems x {samples} rollouts per temperature; share of rollouts by reward "
        f"(1.0 right call / 0.3 right text / 0.1 wrong call / 0 other), per kind; x = against T={temperatures[0]}"
    ]
    for temperature, result in results.items():
        for kind in sorted(result["shares"]):
            share = result["shares"][kind]
            base_right = base["shares"].get(kind, {}).get(1.0, 0.0)
            lines.append(
                f"T={temperature:<4} {kind}  "
                + " / ".join(f"{share[r]:.2f}" for r in REWARDS)
                + f"   right calls {ratio(share[1.0], base_right)}"
            )
        lines.append(
            f"T={temperature:<4} all kinds: right calls {result['right']:.3f} "
            f"({ratio(result['right'], base['right'])}), groups of {group_size} whose rewards all tie "
            f"{result['tied']:.2f} ({ratio(result['tied'], base['tied'])}); {result['seconds']:.0f} s"
        )
    return "\n".join(lines)


def test_bench_demo_exploration() -> None:
    print("\n" + bench([0.7, 0.5], problems=6, samples=8))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.7, 0.5])
    parser.add_argument("--problems", type=int, default=12)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=4)
    options = parser.parse_args()
    print(bench(options.temperatures, options.problems, options.samples, options.group_size))
