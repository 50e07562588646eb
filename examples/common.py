"""Helpers shared by the examples: where the data lives, command-line options, evaluation summaries."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import statistics
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA_DIR = REPO_ROOT.parent / "shared" / "data"

logger = logging.getLogger(__name__)


class DataNotFoundError(FileNotFoundError):
    """A data file an example needs is not where the data directory says."""


def data_file(data_dir: Path, relative: str) -> Path:
    """``data_dir / relative``, or a :class:`DataNotFoundError` naming both and how to fix it."""
    path = Path(data_dir) / relative
    if not path.exists():
        raise DataNotFoundError(
            f"{relative!r} not found under data directory {str(data_dir)!r} (looked for {str(path)!r}); "
            "pass --data-dir pointing at your copy of the data (layout: see the example's README)"
        )
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSON-lines file; a bad line is an error naming the file and line number."""
    rows: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
    return rows


def base_parser(description: str) -> argparse.ArgumentParser:
    """An argument parser with the options every example shares."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=DEFAULT_DATA_DIR,
        help=f"directory holding the example data (default: {DEFAULT_DATA_DIR})",
    )
    parser.add_argument("--log-level", default="WARNING", help="logging level (default: WARNING)")
    return parser


def endpoint_parser(description: str) -> argparse.ArgumentParser:
    """Options of the ``eval.py`` scripts: the model (any OpenAI-compatible endpoint, or a run / model served
    in-process) and how much to evaluate; the scripts hand them to ``agl.evaluate``."""
    parser = base_parser(description)
    parser.add_argument("--base-url", help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument(
        "--model",
        required=True,
        help="with --base-url: the model name to request; without: a training run's directory, a model directory "
        "or LoRA adapter, 'smollm2' or a hub name, served in-process",
    )
    parser.add_argument("--api-key", default="EMPTY", help="API key for the endpoint (default: EMPTY)")
    parser.add_argument("--limit", type=int, default=None, help="evaluate only the first N held-out tasks")
    parser.add_argument("--workers", type=int, default=4, help="rollouts run in parallel (default: 4)")
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default: 0, greedy)")
    parser.add_argument("--max-tokens", type=int, default=None, help="largest completion per LLM call")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per rollout (default: 600)")
    parser.add_argument(
        "--output", type=Path, default=None, help="the JSON report (default: <run>/eval/<name>.json for a run)"
    )
    parser.add_argument("--rollouts", type=Path, default=None, help="also write one JSON line per rollout here")
    return parser


def evaluate_endpoint(arguments: argparse.Namespace, agent: Any, tasks: Sequence[Any], name: str) -> Any:
    """``agl.evaluate`` of ``agent`` on ``tasks`` (the first ``--limit``) with :func:`endpoint_parser`'s options;
    prints and returns the report (its rollouts also go to ``--rollouts`` when given)."""
    import agentlightning as agl

    tasks = list(tasks[: arguments.limit] if arguments.limit else tasks)
    report = agl.evaluate(
        agent,
        tasks,
        arguments.base_url or arguments.model,
        name=name,
        model_name=arguments.model if arguments.base_url else None,
        api_key=arguments.api_key,
        temperature=arguments.temperature,
        max_tokens=arguments.max_tokens,
        n_workers=arguments.workers,
        timeout=arguments.timeout,
        output=arguments.output,
    )
    if arguments.rollouts:
        write_rollouts(arguments.rollouts, report.rollout_records)
    print(report.summary())
    return report


@dataclass(frozen=True)
class EvalSummary:
    """Scores of one evaluation run."""

    n: int
    mean_reward: float
    accuracy: float
    failed: int

    def line(self, name: str) -> str:
        """A one-line human summary."""
        return (
            f"{name}: {self.n} rollouts, mean reward {self.mean_reward:.4f}, "
            f"accuracy (reward >= 1) {self.accuracy:.4f}, failed rollouts {self.failed}"
        )


def summarise(rollouts: Sequence[Any]) -> EvalSummary:
    """Mean reward (a failed rollout counts 0), share of rollouts with reward 1, and failures."""
    rewards = [r.final_reward if r.final_reward is not None else 0.0 for r in rollouts]
    failed = sum(1 for r in rollouts if r.status != "succeeded")
    return EvalSummary(
        n=len(rollouts),
        mean_reward=statistics.fmean(rewards) if rewards else 0.0,
        accuracy=(sum(1 for value in rewards if value >= 1.0 - 1e-9) / len(rewards)) if rewards else 0.0,
        failed=failed,
    )


def write_rollouts(path: Path, rollouts: Sequence[Any]) -> None:
    """One JSON line per rollout (the full record: calls, rewards, errors)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for rollout in rollouts:
            handle.write(rollout.model_dump_json() + "\n")


@dataclass
class DryRunResult:
    """What a ``--dry-run`` produced: the captured rollouts and the transitions LightningRL made of them."""

    rollouts: list[Any]
    transitions: list[Any]

    def roles(self) -> list[str | None]:
        """Roles of the transitions, in order."""
        return [transition.role for transition in self.transitions]


def mock_dry_run(
    agent: Any,
    tasks: Sequence[Any],
    handler: Any,
    *,
    group_size: int = 2,
    n_workers: int = 4,
    air: Any = None,
) -> DryRunResult:
    """Run ``agent`` on every task ``group_size`` times against a local mock model (rule-based ``handler``) with
    vLLM-style token ids, then make the GRPO transitions of the trainable roles that training would use."""
    import agentlightning as agl
    from agentlightning.rl.advantages import compute_advantages
    from agentlightning.testing import MockLLMServer

    repeated = [task for task in tasks for _ in range(group_size)]
    with MockLLMServer(handler=handler, token_ids=True) as server:
        rollouts = agl.run(agent, repeated, llm=server.llm(), n_workers=n_workers, timeout=120)
    transitions = compute_advantages(agl.transitions(rollouts, roles=agent.roles, air=air), "grpo")
    return DryRunResult(rollouts=rollouts, transitions=transitions)


def print_dry_run(result: DryRunResult) -> None:
    """A readable table of the rollouts and the transitions (command-line output of ``--dry-run``)."""
    print(f"{'task':<28} {'status':<10} {'reward':>6}  calls (kind:role[:status])")
    for rollout in result.rollouts:
        calls = " ".join(
            f"{call.kind}:{call.role}" + ("" if call.status == "ok" else f":{call.status}") for call in rollout.calls
        )
        reward = "-" if rollout.final_reward is None else f"{rollout.final_reward:.3f}"
        print(f"{str(rollout.task_id)[:28]:<28} {rollout.status:<10} {reward:>6}  {calls}")
        if rollout.error is not None:
            print(f"    error: {rollout.error.type}: {rollout.error.message}")
    print(f"\n{len(result.transitions)} transitions for training:")
    print(f"{'task':<28} {'role':<22} {'prompt':>6} {'compl.':>6} {'reward':>7} {'adv.':>7}")
    for transition in result.transitions:
        advantage = "-" if transition.advantage is None else f"{transition.advantage:+.3f}"
        print(
            f"{str(transition.task_id)[:28]:<28} {str(transition.role):<22} {len(transition.prompt_token_ids):>6} "
            f"{len(transition.completion_token_ids):>6} {transition.reward:>7.3f} {advantage:>7}"
        )
    summary = summarise(result.rollouts)
    print("\n" + summary.line("dry run"))


class MockPolicyBackend:
    """A training backend for ``--dry-run``: a local mock model (rule-based ``handler``) answers for every policy.

    The training loop is otherwise the real one: the Lightning proxy routes each role to its policy and records
    its version, every policy trains its own LoRA adapter of a tiny random model (the mock's byte-level token ids
    fit its vocabulary), checkpoints are written. Only the answers do not follow the updated adapters."""

    def __init__(self, handler: Any) -> None:
        from agentlightning.testing import MockLLMServer

        self.server = MockLLMServer(handler=handler, token_ids=True)
        self.sampling_overrides: dict[str, Any] = {}
        self.versions: dict[str | None, str] = {}

    @property
    def base_url(self) -> str:
        return self.server.base_url

    @property
    def model_name(self) -> str:
        return "mock-model"

    @property
    def model_version(self) -> str:
        return ",".join(f"{name}@{version}" for name, version in sorted(self.versions.items()) if name)

    @property
    def generates_during_update(self) -> bool:
        return False

    @property
    def last_logprob_gap(self) -> float | None:
        return None

    def start(self) -> MockPolicyBackend:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    @contextlib.contextmanager
    def updating(self, new_version: str, policy: str | None = None) -> Iterator[None]:
        yield
        self.versions[policy] = new_version

    def served(self, policy: str | None) -> tuple[str, str]:
        return ("mock-model", "base") if policy is None else (f"mock-{policy}", self.versions.get(policy, "v0"))


def policy_dry_run(
    plan: dict[str, Any], handler: Any, tasks: Sequence[Any], policies: dict[str, Any], output_dir: Path, steps: int = 2
) -> Any:
    """``agl.train`` with ``policies`` for ``steps`` steps on ``tasks`` (see :class:`MockPolicyBackend`)."""
    from agentlightning.trainers.models import tiny_model

    import agentlightning as agl

    model, tokenizer = tiny_model(hidden_size=64)
    return agl.train(
        plan["agent"],
        list(tasks),
        model=model,
        tokenizer=tokenizer,
        policies=policies,
        backend=MockPolicyBackend(handler),
        group_size=2,
        tasks_per_step=len(tasks),
        max_steps=steps,
        learning_rate=1e-3,
        micro_batch_size=8,
        max_completion_length=256,
        nworkers=2,
        output_dir=output_dir,
        progress=False,
        save_model=False,
        val_every=0,
        air=plan.get("air"),
    )


def add_training_arguments(
    parser: argparse.ArgumentParser,
    *,
    model: str,
    group_size: int = 8,
    tasks_per_step: int = 32,
    max_steps: int = 200,
    learning_rate: float = 1e-6,
    max_completion_length: int = 512,
    output_dir: str,
) -> None:
    """Options passed on to ``agl.train`` (defaults are the example's GPU recipe)."""
    group = parser.add_argument_group("training (agl.train)")
    group.add_argument("--model", default=model, help=f"hub name, local directory or 'smollm2' (default: {model})")
    group.add_argument("--dtype", default=None, help="weights dtype (default: bfloat16 on GPU, float32 on CPU)")
    group.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    group.add_argument("--lora", action="store_true", help="train a LoRA adapter instead of all weights")
    group.add_argument("--group-size", type=int, default=group_size, help="GRPO group: rollouts per task")
    group.add_argument("--tasks-per-step", type=int, default=tasks_per_step, help="tasks per training step")
    group.add_argument("--max-steps", type=int, default=max_steps, help="training steps")
    group.add_argument("--learning-rate", type=float, default=learning_rate)
    group.add_argument("--max-completion-length", type=int, default=max_completion_length)
    group.add_argument("--val-every", type=int, default=10, help="validate every N steps (0: before and after only)")
    group.add_argument("--val-size", type=int, default=None, help="validate on the first N held-out tasks")
    group.add_argument("--nworkers", type=int, default=8, help="rollout worker processes")
    group.add_argument("--output-dir", default=output_dir, help="metrics.jsonl, reward_curve.png, checkpoints")
    group.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --output-dir")
    group.add_argument("--overwrite", action="store_true", help="replace the run already in --output-dir")
    group.add_argument(
        "--allow-no-update",
        action="store_true",
        help="accept a run in which no step updated the model (every group's rewards equal)",
    )
    group.add_argument(
        "--config",
        type=Path,
        help="JSON/YAML file of agl.train settings (TrainConfig fields, e.g. configs/gpu.json: model, backend='vllm', "
        "vllm options); its fields replace the options above, and a 'model' in it is loaded by agl.train",
    )


def training_kwargs(arguments: argparse.Namespace) -> dict[str, Any]:
    """The ``agl.train`` keyword arguments given by :func:`add_training_arguments` options (the model only when
    ``--config`` names one), with the fields of ``--config`` laid over them."""
    from agentlightning.trainers.config import config_options

    return {
        "algorithm": "grpo",
        "lora": True if arguments.lora else None,
        "group_size": arguments.group_size,
        "tasks_per_step": arguments.tasks_per_step,
        "max_steps": arguments.max_steps,
        "learning_rate": arguments.learning_rate,
        "max_completion_length": arguments.max_completion_length,
        "val_every": arguments.val_every,
        "nworkers": arguments.nworkers,
        "output_dir": arguments.output_dir,
        "resume": arguments.resume,
        "overwrite": arguments.overwrite,
        "allow_no_update": arguments.allow_no_update,
        **(config_options(arguments.config) if arguments.config else {}),
    }


def load_policy(arguments: argparse.Namespace) -> tuple[Any, Any]:
    """``(model, tokenizer)`` to train, on the GPU when there is one."""
    import torch
    from agentlightning.trainers.models import load_model

    device = arguments.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = arguments.dtype or ("bfloat16" if device.startswith("cuda") else "float32")
    logger.info("loading %s as %s on %s", arguments.model, dtype, device)
    return load_model(arguments.model, dtype=dtype, device=device)


def run_recipe(
    arguments: argparse.Namespace,
    plan: dict[str, Any],
    mock_handler: Callable[[list[dict[str, Any]]], Any],
    dry_run_tasks: list[dict[str, Any]],
    group_size: int,
) -> int:
    """The shared end of every ``train.py``: ``--dry-run`` against the mock model, else ``agl.train`` on the policy."""
    if arguments.dry_run:
        result = mock_dry_run(
            plan["agent"], dry_run_tasks, mock_handler(dry_run_tasks), group_size=group_size, air=plan.get("air")
        )
        print_dry_run(result)
        return 0
    import agentlightning as agl

    if "model" in plan:  # named by --config: agl.train loads it (and starts vLLM from it with backend="vllm")
        print(agl.train(**plan).summary())
        return 0
    model, tokenizer = load_policy(arguments)
    print(agl.train(model=model, tokenizer=tokenizer, **plan).summary())
    return 0


def cli(main: Callable[[], int]) -> int:
    """Run a script's ``main``; a missing data file (exit status 2) and a run that trained nothing (exit status 1, as
    ``agl train``) are one-line errors, not tracebacks."""
    from agentlightning.errors import NothingTrainedError

    try:
        return main()
    except DataNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except NothingTrainedError as exc:
        print(exc.result.summary(), flush=True)
        print(f"error: {exc}", file=sys.stderr)
        return 1
