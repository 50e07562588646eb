"""``agl eval`` (score an agent against a model, or compare two reports) and ``agl sft`` (fine-tune on a run's
successful rollouts): each a parser function and a command function, registered by :mod:`agentlightning._cli`."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def eval_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``agl eval``."""
    parser.add_argument("agent", nargs="?", help="the agent as 'package.module:function'")
    parser.add_argument("--dataset", help="JSONL or JSON file of tasks to evaluate on")
    parser.add_argument(
        "--model",
        help="a training run's directory, a model directory or LoRA adapter, 'smollm2', a hub name, or an "
        "OpenAI-compatible URL (http://host:8000/v1)",
    )
    parser.add_argument("--model-name", help="model to request from a URL (default: the first it lists)")
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "EMPTY"), help="API key of a URL")
    parser.add_argument("--name", help="name of the evaluation (default: the dataset file's stem)")
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    parser.add_argument("--max-tokens", type=int, help="largest completion per LLM call")
    parser.add_argument("--repeats", type=int, default=1, help="rollouts per task (default 1)")
    parser.add_argument("--limit", type=int, help="evaluate only the first N tasks")
    parser.add_argument("--workers", type=int, default=4, help="rollouts run at the same time (default 4)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per rollout (default 600)")
    parser.add_argument(
        "--output", help="report file (default: <run>/eval/<name>.json for a run's directory, else runs/eval/)"
    )
    parser.add_argument(
        "--compare",
        nargs=2,
        metavar=("BEFORE", "AFTER"),
        help="print AFTER - BEFORE of two saved reports with 95%% intervals (no evaluation)",
    )


def run_eval(args: argparse.Namespace) -> int:
    """``agl eval``."""
    from agentlightning.evaluation import EvalReport, compare, default_report_path, evaluate

    if args.compare:
        before, after = (EvalReport.load(path) for path in args.compare)
        print(compare(before, after).summary(), flush=True)
        return 0
    if not (args.agent and args.dataset and args.model):
        raise ValueError("give AGENT, --dataset and --model (or --compare BEFORE AFTER)")
    from agentlightning.client._client import load_records
    from agentlightning.client._worker import load_agent

    sys.path.insert(0, os.getcwd())  # agents named relative to the working directory, as `python -m` would
    tasks = load_records(args.dataset)
    if args.limit:
        tasks = tasks[: args.limit]
    name = args.name or Path(args.dataset).stem
    output = args.output or default_report_path(args.model, name) or Path("runs") / "eval" / f"{name}.json"
    report = evaluate(
        load_agent(args.agent),
        tasks,
        args.model,
        name=name,
        model_name=args.model_name,
        api_key=args.api_key,
        temperature=args.temperature,
        max_tokens=args.max_tokens,
        repeats=args.repeats,
        n_workers=args.workers,
        timeout=args.timeout,
        output=output,
    )
    print(report.summary(), flush=True)
    print(f"report: {output}", flush=True)
    return 0


def sft_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``agl sft``."""
    parser.add_argument(
        "--from",
        dest="source",
        required=True,
        help="a training run's directory (its store.db), a store file, or a JSON-lines file of rollouts",
    )
    parser.add_argument("--min-reward", type=float, default=1.0, help="keep rollouts with at least this reward")
    parser.add_argument("--model", default="smollm2", help="the model to fine-tune (default: smollm2)")
    parser.add_argument("--roles", nargs="+", help="roles whose LLM calls become rows (default: all)")
    parser.add_argument("--task-ids", help="a JSON list of task ids, or a file of them one a line: only these tasks")
    parser.add_argument("--output-dir", default="runs/sft", help="adapter/, model/ (merged) and sft_rows.jsonl")
    parser.add_argument("--epochs", type=float, default=2.0)
    parser.add_argument("--learning-rate", type=float, default=2e-4)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)


def run_sft(args: argparse.Namespace) -> int:
    """``agl sft``."""
    try:
        from agentlightning.trainers.sft import sft
    except ImportError as exc:
        raise RuntimeError(f"agl sft needs the training extra: pip install 'agentlightning[train]' ({exc})") from None
    result = sft(
        args.source,
        args.model,
        min_reward=args.min_reward,
        roles=args.roles,
        task_ids=_task_ids(args.task_ids),
        output_dir=args.output_dir,
        epochs=args.epochs,
        learning_rate=args.learning_rate,
        batch_size=args.batch_size,
        seed=args.seed,
    )
    print(result.summary(), flush=True)
    return 0


def _task_ids(value: str | None) -> list[str] | None:
    if value is None:
        return None
    import json

    path = Path(value)
    if path.is_file():
        return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    ids = json.loads(value)
    if not isinstance(ids, list):
        raise ValueError(f"--task-ids {value!r}: give a JSON list of ids or a file of ids, one a line")
    return [str(task_id) for task_id in ids]
