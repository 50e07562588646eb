"""``agl server --model``: the Lightning Server trains on the rollouts that remote clients run."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence

from agentlightning.trainers.config import TrainConfig, config_options
from agentlightning.trainers.loop import TrainingRun
from agentlightning.trainers.rollouts import RemoteRollouts

from agentlightning.server import LightningServer

logger = logging.getLogger(__name__)


def serve_training(server: LightningServer, args: argparse.Namespace, extra: Sequence[str]) -> int:
    """``agl server --model NAME [trainer options]``: serve rollouts to remote clients and train on them.

    Starts ``server`` (built from ``args``, the ``agl server`` options), waits for the first client to attach
    a dataset (``agl.Client().train(agent, dataset=...)``), then runs the ``agl.train`` loop with that dataset,
    the rollouts being run by the clients. Trainer options (``extra``): ``--max-steps``, ``--group-size``,
    ``--tasks-per-step``, ``--learning-rate``, ``--lora-rank`` (0 = full fine-tuning), ``--temperature``,
    ``--max-completion-length``, ``--output-dir``, ``--resume``, ``--val-fraction``, ``--val-every``, and any
    :class:`TrainConfig` field through ``--config FILE`` / ``--set FIELD=VALUE`` (as ``agl train``; they win).
    """
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
    parser.add_argument("--config", help="JSON (or YAML) file of TrainConfig fields")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="FIELD=VALUE")
    options = parser.parse_args(list(extra))
    overrides = config_options(options.config, options.sets)  # a bad file fails now, not once a client attaches
    if not 0 <= options.val_fraction < 1:
        parser.error(f"--val-fraction must be in [0, 1), got {options.val_fraction}")

    server.start()
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
        config = TrainConfig(
            model=args.model,
            group_size=options.group_size,
            tasks_per_step=options.tasks_per_step,
            max_steps=options.max_steps,
            learning_rate=options.learning_rate,
            lora={"r": options.lora_rank, "lora_alpha": 2 * options.lora_rank} if options.lora_rank else None,
            temperature=options.temperature,
            max_completion_length=options.max_completion_length,
            val_every=options.val_every,
            output_dir=options.output_dir,
            resume=options.resume,
            checkpoint_every=10,
            nworkers=0,
            rollout_timeout=args.timeout,
        )
        config = TrainConfig.from_options(config, overrides)
        run = TrainingRun(None, train_tasks, config, val_dataset=val, source=RemoteRollouts(server, logprobs=True))
        print(run.run().summary(), flush=True)
    finally:
        server.stop()
    return 0
