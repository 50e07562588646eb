"""``agl server --model``: the Lightning Server trains on the rollouts that remote clients run."""

from __future__ import annotations

import argparse
import logging

from agentlightning.trainers._arguments import options_from_args
from agentlightning.trainers.config import NothingTrainedError, TrainConfig
from agentlightning.trainers.loop import TrainingRun
from agentlightning.trainers.models import check_model_source
from agentlightning.trainers.reporting import check_reporters
from agentlightning.trainers.rollouts import RemoteRollouts

from agentlightning._signals import stop_like_ctrl_c
from agentlightning.server import LightningServer

logger = logging.getLogger(__name__)


def serve_training(server: LightningServer, args: argparse.Namespace) -> int:
    """``agl server --model NAME [training options]``: serve rollouts to remote clients and train on them.

    Starts ``server`` (built from ``args``, the ``agl server`` options), waits for the first client to attach
    a dataset (``agl.Client().train(agent, dataset=...)``), then runs the ``agl.train`` loop with that dataset,
    the rollouts being run by the clients. The training options are those of ``agl train``, with the same
    defaults (``TrainConfig``'s fields as flags, ``--config FILE``, ``--set FIELD=VALUE``); the rollout timeout is
    the server's ``--timeout``; ``--val-fraction`` holds out a share of the dataset. SIGTERM and SIGHUP stop it as
    Ctrl-C does: the training run (and a vLLM server it started) and the Lightning Server stop.
    """
    config = training_config(args)
    with stop_like_ctrl_c("agl server --model"):
        return _serve(server, args, config)


def _serve(server: LightningServer, args: argparse.Namespace, config: TrainConfig) -> int:
    server.start()
    print(f"Lightning server on {server.url}; waiting for a client to attach a dataset", flush=True)
    try:
        dataset_id = server.wait_for_dataset()
        if dataset_id is None:
            logger.error("no dataset was attached; nothing to train")
            return 1
        tasks = [task.payload for task in server.store.dataset_tasks(dataset_id)]
        held = int(len(tasks) * args.val_fraction)
        val, train_tasks = (tasks[:held], tasks[held:]) if held else (None, tasks)
        logger.info("training %s on dataset %s (%d tasks, %d held out)", args.model, dataset_id, len(train_tasks), held)
        run = TrainingRun(None, train_tasks, config, val_dataset=val, source=RemoteRollouts(server, logprobs=True))
        try:
            result = run.run()
        except NothingTrainedError as exc:
            print(exc.result.summary(), flush=True)
            logger.error("%s", exc)
            return 1
        print(result.summary(), flush=True)
    finally:
        server.stop()
    return 0


def training_config(args: argparse.Namespace) -> TrainConfig:
    """The run's :class:`TrainConfig` from the ``agl server --model`` options (checked: call it before anything
    starts, so that a bad option or config file fails at once, not once a client attaches)."""
    if not 0 <= args.val_fraction < 1:
        raise ValueError(f"--val-fraction must be in [0, 1), got {args.val_fraction}")
    options = {"model": args.model, "nworkers": 0, "rollout_timeout": args.timeout, **options_from_args(args)}
    config = TrainConfig.from_options(None, options)
    check_reporters(config.report_to)
    check_model_source(args.model)
    return config
