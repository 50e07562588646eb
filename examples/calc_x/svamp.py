"""``python -m examples.calc_x.svamp`` (``make svamp``): SVAMP one-operation problems through the Calc-X AutoGen
agent, held-out accuracy before and after training.

One command, in this order:

1. evaluate the base model (greedy) on the 162 held-out problems of the fixed split (``svamp_one_op_split.json``);
2. with ``--sft``: run the base model on training problems (sampled, ``--sft-samples`` each), keep the rollouts
   that got the answer right, fine-tune a LoRA adapter on their captured token ids (``agl sft``'s path) and start
   GRPO from the merged model;
3. train with GRPO (``agl.train``, the settings of ``configs/svamp_cpu.json`` unless ``--config``) on the 600
   training problems;
4. evaluate the trained model (greedy) on the held-out problems, print the difference with its 95% interval;
5. write ``<output>/curve.png`` (every run under ``--output-dir``) and add a row to the results table
   (``docs/results.md``'s "SVAMP" section).

The agent is ``examples.calc_x.calc_agent.calc_agent`` unchanged; ``svamp_agent.svamp_agent`` only caps its
completions at ``--max-tokens`` (through ``llm.sampling_parameters``, which the agent reads) so that a CPU run fits
in its budget; evaluation and training use the same cap. The held-out problems are never trained on or looked at while
training: the SFT rollouts and the GRPO tasks are training problems only.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import agentlightning as agl
from agentlightning.evaluation import EvalReport, compare
from agentlightning.rl.air import ToolErrorRule
from examples.calc_x.data import load_svamp_one_op
from examples.calc_x.svamp_agent import DEFAULT_MAX_TOKENS, MAX_TOKENS_ENV, svamp_agent
from examples.common import DEFAULT_DATA_DIR, REPO_ROOT, cli

logger = logging.getLogger(__name__)

CPU_CONFIG = Path(__file__).parent / "configs" / "svamp_cpu.json"


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m examples.calc_x.svamp", description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR, help="holds calc_x/svamp/SVAMP.json")
    parser.add_argument("--output-dir", type=Path, default=Path("runs/svamp"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--config", type=Path, default=CPU_CONFIG, help="agl.train settings (TrainConfig fields)")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="FIELD=VALUE", help="override one")
    parser.add_argument("--sft", action="store_true", help="warm up with SFT on the base model's right answers")
    parser.add_argument("--sft-tasks", type=int, default=96, help="training problems the base model tries for SFT")
    parser.add_argument("--sft-samples", type=int, default=2, help="tries per problem (temperature --sft-temperature)")
    parser.add_argument("--sft-temperature", type=float, default=0.7)
    parser.add_argument("--sft-epochs", type=float, default=2.0)
    parser.add_argument("--sft-learning-rate", type=float, default=2e-4)
    parser.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, help="largest completion per call")
    parser.add_argument("--heldout-limit", type=int, help="evaluate on the first N held-out problems (reduced budget)")
    parser.add_argument("--workers", type=int, default=32, help="evaluation rollouts at a time (batched decoding)")
    parser.add_argument("--tool-error-penalty", type=float, default=-0.5, help="AIR reward of a failed tool call")
    parser.add_argument("--results", type=Path, help="results file (default docs/results.md)")
    parser.add_argument("--note", default="", help="a remark for the results row (e.g. the machine's load)")
    return parser


def main(argv: list[str] | None = None) -> int:
    arguments = parser().parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ[MAX_TOKENS_ENV] = str(arguments.max_tokens)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("examples").setLevel(logging.INFO)
    started = time.perf_counter()
    train = load_svamp_one_op(arguments.data_dir, "train")
    heldout = load_svamp_one_op(arguments.data_dir, "heldout")[: arguments.heldout_limit]
    arm = "sft+grpo" if arguments.sft else "grpo"
    run_dir = arguments.output_dir / f"{arm}-seed{arguments.seed}"
    timings: dict[str, float] = {}
    from agentlightning.trainers.config import config_options

    options = {**config_options(arguments.config, arguments.sets), "seed": arguments.seed}
    base_model = str(options.get("model", "smollm2"))

    base_name = f"{Path(base_model).name}-heldout{len(heldout)}-tok{arguments.max_tokens}"
    base_path = arguments.output_dir / "base" / "eval" / f"{base_name}.json"
    phase = time.perf_counter()
    base = _evaluate(base_model, heldout, base_path, arguments.workers, reuse=True)
    timings["base_eval"] = time.perf_counter() - phase
    print(f"base model on {len(heldout)} held-out problems:\n{base.summary()}", flush=True)

    if arguments.sft:
        phase = time.perf_counter()
        options["model"] = _sft_warm_start(arguments, base_model, train, run_dir / "sft")
        timings["sft"] = time.perf_counter() - phase

    phase = time.perf_counter()
    result = agl.train(
        svamp_agent,
        train,
        output_dir=run_dir / "grpo",
        air=[ToolErrorRule(penalty=arguments.tool_error_penalty)],
        **options,
    )
    timings["grpo"] = time.perf_counter() - phase
    print(result.summary(), flush=True)

    phase = time.perf_counter()
    final = _evaluate(str(run_dir / "grpo"), heldout, run_dir / "grpo" / "eval" / "heldout.json", arguments.workers)
    timings["final_eval"] = time.perf_counter() - phase
    timings["total"] = time.perf_counter() - started
    difference = compare(base, final)
    print(f"trained model on the held-out problems:\n{final.summary()}\n{difference.summary()}", flush=True)

    summary = {
        "arm": arm,
        "seed": arguments.seed,
        "command": "python -m examples.calc_x.svamp " + " ".join(argv if argv is not None else sys.argv[1:]),
        "heldout": len(heldout),
        "steps": result.steps,
        "minutes": {key: round(value / 60, 2) for key, value in timings.items()},
        "base": base.accuracy.model_dump(),
        "final": final.accuracy.model_dump(),
        "difference": difference.accuracy.model_dump(),
        "load": os.getloadavg()[0],
        "note": arguments.note,
        "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    curve = plot_curves(arguments.output_dir)
    results = arguments.results or _results_file()
    add_result_row(results, summary)
    minutes = timings["total"] / 60
    print(f"whole command {minutes:.1f} min ({json.dumps(summary['minutes'])}); curve {curve}; results {results}")
    return 0


def _evaluate(model: str, tasks: list[dict[str, Any]], path: Path, workers: int, reuse: bool = False) -> EvalReport:
    """The greedy held-out evaluation of ``model`` (with ``reuse``, a report already written is read instead)."""
    if reuse and path.is_file():
        logger.info("reusing the base model's held-out report %s (greedy, same tasks and cap)", path)
        return EvalReport.load(path)
    return agl.evaluate(svamp_agent, tasks, model, name="heldout", n_workers=workers, output=path)


def _sft_warm_start(
    arguments: argparse.Namespace, base_model: str, train: list[dict[str, Any]], directory: Path
) -> str:
    """Sample the base model on training problems, keep its right answers, SFT a LoRA adapter on them; return the
    merged model's directory (the base model when no answer was right)."""
    from agentlightning.trainers.sft import NoSFTRowsError, sft

    tasks = random.Random(arguments.seed).sample(train, min(arguments.sft_tasks, len(train)))
    collected = agl.evaluate(
        svamp_agent,
        tasks,
        base_model,
        name="sft-collect",
        temperature=arguments.sft_temperature,
        repeats=arguments.sft_samples,
        n_workers=arguments.workers,
        output=directory / "collect.json",
    )
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "collect_rollouts.jsonl", "w", encoding="utf-8") as handle:
        handle.writelines(rollout.model_dump_json() + "\n" for rollout in collected.rollout_records)
    print(f"SFT data from the base model:\n{collected.summary()}", flush=True)
    try:
        result = sft(
            collected.rollout_records,
            base_model,
            min_reward=1.0,
            task_ids=[task["task_id"] for task in train],
            output_dir=directory,
            epochs=arguments.sft_epochs,
            learning_rate=arguments.sft_learning_rate,
            seed=arguments.seed,
        )
    except NoSFTRowsError as exc:
        logger.warning("no SFT warm start (%s): GRPO starts from the base model", exc)
        return base_model
    print(result.summary(), flush=True)
    return str(result.model_dir)


def plot_curves(output_dir: Path) -> Path | None:
    """``<output_dir>/curve.png``: each run's training reward per step, and its held-out accuracy before and after
    (with 95% intervals)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = sorted(path.parent for path in output_dir.glob("*/summary.json"))
    if not runs:
        return None
    figure, (train_axis, heldout_axis) = plt.subplots(1, 2, figsize=(11, 4))
    for index, run in enumerate(runs):
        summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
        rows = [json.loads(line) for line in (run / "grpo" / "metrics.jsonl").read_text().splitlines() if line]
        steps = [row["step"] for row in rows if "reward" in row]
        train_axis.plot(steps, [row["reward"] for row in rows if "reward" in row], marker="o", label=run.name)
        points = [summary["base"], summary["final"]]
        x = [index * 0.1, 1 + index * 0.1]
        heldout_axis.errorbar(
            x,
            [p["value"] for p in points],
            yerr=[[p["value"] - p["low"] for p in points], [p["high"] - p["value"] for p in points]],
            marker="o",
            capsize=4,
            label=run.name,
        )
    train_axis.set(xlabel="GRPO step", ylabel="mean training reward", title="training rollouts")
    heldout_axis.set(xticks=[0, 1], xticklabels=["base", "trained"], ylabel="held-out accuracy (Wilson 95%)")
    heldout_axis.set_title("SVAMP one-op held-out")
    for axis in (train_axis, heldout_axis):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    figure.tight_layout()
    path = output_dir / "curve.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


RESULTS_HEADING = "## SVAMP"
TABLE_HEADER = (
    "| finished | arm | seed | held-out | base acc. [95%] | trained acc. [95%] | difference [95%, paired] | ratio | "
    "GRPO steps | minutes (whole / base eval / SFT / GRPO / final eval) | load | command | note |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
)


def _results_file() -> Path:
    return REPO_ROOT / "docs" / "results.md"


def add_result_row(path: Path, summary: dict[str, Any]) -> None:
    """Put ``summary`` as the first row of the table under ``## SVAMP`` in ``path`` (newest first), creating the
    section (and the file) when missing."""

    def cell(interval: dict[str, float], signed: bool = False) -> str:
        form = "+.3f" if signed else ".3f"
        return f"{interval['value']:{form}} [{interval['low']:{form}}, {interval['high']:{form}}]"

    base, final, minutes = summary["base"], summary["final"], summary["minutes"]
    ratio = f"{final['value'] / base['value']:.2f}x" if base["value"] else "-"
    row = (
        f"| {summary['finished']} | {summary['arm']} | {summary['seed']} | {summary['heldout']} | {cell(base)} | "
        f"{cell(final)} | {cell(summary['difference'], signed=True)} | {ratio} | {summary['steps']} | "
        f"{minutes['total']} / {minutes['base_eval']} / {minutes.get('sft', '-')} / {minutes['grpo']} / "
        f"{minutes['final_eval']} | {summary['load']:.1f} | `{summary['command']}` | {summary['note']} |\n"
    )
    text = path.read_text(encoding="utf-8") if path.is_file() else "# Results\n"
    if RESULTS_HEADING not in text:
        text = text.rstrip("\n") + f"\n\n{RESULTS_HEADING}\n\n{TABLE_HEADER}"
    head, _, rest = text.partition(RESULTS_HEADING)
    table_at = rest.index(TABLE_HEADER) + len(TABLE_HEADER) if TABLE_HEADER in rest else None
    if table_at is None:
        rest = f"\n\n{TABLE_HEADER}" + rest.lstrip("\n")
        table_at = rest.index(TABLE_HEADER) + len(TABLE_HEADER)
    path.write_text(head + RESULTS_HEADING + rest[:table_at] + row + rest[table_at:], encoding="utf-8")


if __name__ == "__main__":
    sys.exit(cli(main))
