"""The CPU demo's arithmetic task split into two roles, each trained as its own policy (one LoRA adapter each).

The *planner* reads the word problem and writes the arithmetic expression that answers it; the *caller* gets the
problem and the expression found in the plan (the plan's text when it has none) and calls the calculator tool. The
caller's solved example has the same shape (the base model follows the shape of the example: with the planner's
raw prose in view it answered in text and the caller got no reward to learn from). ``agl.train(policies=...)``
gives each role its own adapter on SmolLM2-135M, its own GRPO statistics and credit:

- the planner is rewarded for its plan: 1.0 when the expression's value is the answer, 0.1 when it combines the
  problem's own numbers, else 0;
- the caller gets the episode's reward (``examples.demo.task.score``: 1.0 for a calculator call with the right
  value, ...).

    python -m examples.planner_caller.train              # CPU, SmolLM2 (the bundled GGUF), 8 steps, ~27 min loaded
    python -m examples.planner_caller.train --steps 2    # a quick look

Both policies are evaluated greedily on 16 held-out problems before training and every 2 steps
(``val/policy/<name>/reward`` in ``metrics.jsonl`` under ``--output-dir``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import openai

import agentlightning as agl
from examples.demo.__main__ import split_problems
from examples.demo.task import CALCULATOR_TOOL, EXAMPLE, SYSTEM_PROMPT, calculate, score, uses_problem_numbers

PLANNER_PROMPT = [
    {"role": "system", "content": "Write the arithmetic expression that answers the question."},
    {"role": "user", "content": "Ana has 3 pens and gets 2 more. How many pens does Ana have now?"},
    {"role": "assistant", "content": "3 + 2"},
]
CALLER_EXAMPLE = [{"role": "user", "content": f"{EXAMPLE[0]['content']}\nPlan: 3 + 2"}, *EXAMPLE[1:]]
_EXPRESSION = re.compile(r"\d+(?:\.\d+)?(?:\s*[-+*/x×]\s*\d+(?:\.\d+)?)+")


def plan_score(task: dict[str, Any], plan: str) -> float:
    """The planner's reward for ``plan`` (see the module docstring)."""
    found = _EXPRESSION.search(plan or "")
    if found is None:
        return 0.0
    try:
        value = calculate(found.group(0))
    except ValueError:
        return 0.0
    if abs(value - task["answer"]) < 1e-6:
        return 1.0
    return 0.1 if uses_problem_numbers(found.group(0), task["question"]) else 0.0


@agl.rollout(roles=["planner", "caller"])
def planner_caller_agent(task: dict[str, Any], llm: agl.LLM) -> float:
    """Plan, then call the calculator with the plan in view; scored like the single-role demo."""
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=1, timeout=300)
    temperature = llm.sampling_parameters.get("temperature", 0.7)
    with agl.role("planner"):
        plan = (
            client.chat.completions.create(
                model=llm.model,
                messages=[*PLANNER_PROMPT, {"role": "user", "content": task["question"]}],
                max_tokens=16,
                temperature=temperature,
            )
            .choices[0]
            .message.content
            or ""
        )
    found = _EXPRESSION.search(plan)
    question = f"{task['question']}\nPlan: {found.group(0) if found else plan.strip()}"
    with agl.role("caller"):
        message = (
            client.chat.completions.create(
                model=llm.model,
                messages=[
                    {"role": "system", "content": SYSTEM_PROMPT},
                    *CALLER_EXAMPLE,
                    {"role": "user", "content": question},
                ],
                tools=[CALCULATOR_TOOL],
                max_tokens=40,
                temperature=temperature,
            )
            .choices[0]
            .message
        )
    for call in message.tool_calls or []:
        if call.function.name == "calculator":
            try:
                expression = str(json.loads(call.function.arguments)["expression"])
                value = calculate(expression)
            except (ValueError, KeyError, TypeError):
                return score(task, used_tool=True, value=None, well_formed=False)
            return score(
                task, used_tool=True, value=value, well_formed=uses_problem_numbers(expression, task["question"])
            )
    numbers = re.findall(r"-?\d+(?:\.\d+)?", message.content or "")
    return score(task, used_tool=False, value=float(numbers[-1]) if numbers else None, well_formed=False)


def credit(rollout: agl.Rollout, calls: Sequence[agl.Call], policy: str) -> list[float]:
    """Per-policy credit: the planner's calls by their plan, the caller's by the episode's reward."""
    if policy == "planner":
        return [plan_score(rollout.task, (call.output or {}).get("content") or "") for call in calls]
    return [rollout.final_reward or 0.0] * len(calls)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--tasks-per-step", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--val-size", type=int, default=16, help="held-out problems")
    parser.add_argument("--val-every", type=int, default=2)
    parser.add_argument("--learning-rate", type=float, default=3e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--nworkers", type=int, default=32, help="agent threads")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--output-dir", default="runs/planner-caller", help="replaced by each run")
    parser.add_argument("--rollout-timeout", type=float, default=900.0, help="seconds (a busy CPU is slow)")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # idle OpenMP threads sleep (set before torch loads)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("agentlightning.trainers.loop").setLevel(logging.INFO)
    train_set, held_out = split_problems(400, args.val_size, args.seed)
    started = time.perf_counter()
    lora = {"r": 16, "lora_alpha": 32}
    result = agl.train(
        planner_caller_agent,
        train_set,
        model=args.model,
        val_dataset=held_out,
        val_every=args.val_every,
        policies={"planner": agl.Policy(lora=lora), "caller": agl.Policy(lora=lora)},
        credit=credit,
        group_size=args.group_size,
        tasks_per_step=args.tasks_per_step,
        max_steps=args.steps,
        learning_rate=args.learning_rate,
        temperature=0.7,
        micro_batch_size=16,
        max_completion_length=40,
        output_dir=Path(args.output_dir),
        overwrite=True,  # a second run replaces the first
        use_server=False,
        nworkers=args.nworkers,
        seed=args.seed,
        save_model=False,
        rollout_timeout=args.rollout_timeout,
    )
    before, after = result.initial_validation or {}, result.final_validation or {}
    print(f"finished {args.steps} steps in {(time.perf_counter() - started) / 60:.1f} min")
    for key in ("reward", "policy/planner/reward", "policy/caller/reward", "accuracy"):
        print(f"held-out {key}: {before.get(key, float('nan')):.3f} -> {after.get(key, float('nan')):.3f}")
    for row in result.history:
        shown = {k: round(v, 3) for k, v in row.items() if k.startswith(("val/", "policy/")) and k.endswith("reward")}
        seconds = {k: round(row[k]) for k in ("step_seconds", "val_seconds", "elapsed_seconds") if k in row}
        print(f"step {row['step']}: {seconds} {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
