"""The training loop behind ``agl.train``: rollouts -> transitions -> advantages -> packed batch -> TRL update.

:class:`TrainingRun` sets up the pieces of one run and tears them down: the policy model and its learner (a
:class:`~agentlightning.trainers.learner._policy_set.PolicySet`: one
:class:`~agentlightning.trainers.learner.grpo.LightningGRPOTrainer`, or one per policy with ``policies=``, each LoRA
adapter with its own update and version), the backend serving the live weights (HF) or kept in sync with them (vLLM;
behind :class:`~agentlightning.trainers.backends.base.Backend`), the rollout source (Lightning Server + workers, or
in-process), the metrics writer and checkpoints. :class:`_Steps` runs the steps: each one's groups come from a
:class:`~agentlightning.trainers._pipeline.RolloutPipeline`, which with ``max_staleness > 0`` runs the rollouts of the
next steps while a step trains; then validation, the metrics row, the checkpoint and the early stop.

Model versions are ``v<step>``: ``v0`` is the initial model, and a call recorded with ``v3`` was sampled from the
weights after the third update.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentlightning.trainers._pipeline import RolloutPipeline
from agentlightning.trainers._run_dir import run_directory
from agentlightning.trainers.backends._make import make_backend
from agentlightning.trainers.backends.base import Backend
from agentlightning.trainers.config import NothingTrainedError, TrainConfig, TrainResult
from agentlightning.trainers.learner._distributed import Ranks, served_model
from agentlightning.trainers.learner._policy_set import PolicySet, UpdateOptions
from agentlightning.trainers.models import check_model_source
from agentlightning.trainers.policies import PolicyMap, serving_routes
from agentlightning.trainers.reporting import (
    STEP_WARNING,
    MetricsWriter,
    WarningLog,
    check_reporters,
    role_metrics,
    rollout_metrics,
)

from agentlightning._command import CommandAgent
from agentlightning._decorator import RolloutAgent
from agentlightning._signals import stop_like_ctrl_c
from agentlightning.rl.advantages import GROUP_BASELINES

logger = logging.getLogger(__name__)


class TrainingRun:
    """One training run: ``agent`` on ``dataset`` with ``config``, validated on ``val_dataset``.

    ``source`` is a RolloutSource to use instead of starting one (``agl server --model``: remote clients).
    """

    def __init__(
        self,
        agent: Any,
        dataset: Sequence[Any],
        config: TrainConfig,
        *,
        val_dataset: Sequence[Any] | None = None,
        source: Any = None,
    ) -> None:
        if source is None and not isinstance(agent, RolloutAgent):
            if not callable(agent):
                raise TypeError(f"agl.train(agent=...) must be an @agl.rollout function, got {agent!r}")
            agent = RolloutAgent(agent)
        if source is None and not agent.receives_llm:
            raise TypeError(
                f"agl.train: the agent {agent.name} does not take the model it should call, so training could not "
                f"change what it does; give it an llm parameter after the task, def {agent.name}(task, llm): ..., "
                "and build its client from llm.base_url, llm.model and llm.api_key"
            )
        if source is None and isinstance(agent, CommandAgent) and not config.use_server:
            raise ValueError(
                f"agl.train: the command agent {agent.name} is a separate process, so only the server's per-rollout "
                "proxy can record its LLM calls; leave use_server=True (the default)"
            )
        if isinstance(dataset, (str, bytes, dict)) or not isinstance(dataset, Sequence) or not dataset:
            raise ValueError(f"agl.train(dataset=...) must be a non-empty list of tasks, got {type(dataset).__name__}")
        check_reporters(config.report_to)
        if isinstance(config.model, str):
            check_model_source(config.model)
        self.agent, self.dataset, self.config = agent, dataset, config
        self.val_dataset, self.source = val_dataset, source
        self.output_dir = run_directory(config)  # a fresh one, or refused if it holds another run
        self.policies = (
            None if config.policies is None else PolicyMap.parse(config.policies, getattr(agent, "roles", None))
        )

    # -- the run ------------------------------------------------------------------------------------------------

    def run(self) -> TrainResult:
        """Train; SIGTERM and SIGHUP stop the run as Ctrl-C does (:mod:`agentlightning._signals`): the backend,
        the server and the workers it started are stopped before :class:`~agentlightning._signals.Stopped` is
        raised."""
        started = time.perf_counter()
        self.output_dir.mkdir(parents=True, exist_ok=True)
        warning_log = WarningLog(self.output_dir)  # the run's warnings, for the dashboard
        logging.getLogger().addHandler(warning_log)
        try:
            with stop_like_ctrl_c("agl.train"):
                return self._run(started)
        finally:
            logging.getLogger().removeHandler(warning_log)

    def _run(self, started: float) -> TrainResult:
        from agentlightning.trainers.learner.grpo import grpo_config

        model, tokenizer, model_name = self._load_model()
        settings = self._trl_settings()
        config = grpo_config(str(self.output_dir / "trl"), **settings)
        ranks = Ranks()  # after the TRL config, whose process-group settings it applies; rank 0 runs the loop
        if self.policies is not None and ranks.count > 1:
            raise NotImplementedError("agl.train(policies=...) runs in one process, not under `accelerate launch`")
        base_dir = self._vllm_base_dir(model, tokenizer) if ranks.main else None
        learner = self._learner(model, tokenizer, config, settings)
        state = self._restore(learner, ranks)
        if not ranks.main:
            return ranks.follow(learner.first, tokenizer)
        policy = served_model(learner.first, self.config)
        try:
            with contextlib.ExitStack() as stack:
                backend = self._start_backend(learner, policy, tokenizer, model_name, state, base_dir)
                stack.callback(backend.stop)
                writer = MetricsWriter(self.output_dir, self.config.report_to, run_name=self.output_dir.name)
                stack.callback(writer.close)
                source = self._rollout_source()
                stack.callback(source.close)
                sampler = _TaskSampler.resumed(len(self.dataset), self.config, state.values)
                pipeline = self._pipeline(source, sampler, state)
                stack.callback(pipeline.close)
                steps = _Steps(self, learner, backend, source, pipeline, writer, sampler, ranks, state, started)
                steps.run()
        except BaseException as error:
            ranks.abort(learner.first, error)
            raise
        result = self._result(steps, policy, tokenizer)
        ranks.finish(result)
        logger.debug("training finished:\n%s", result.summary())  # agl train prints it
        if result.steps and not result.updated_steps and not self.config.allow_no_update:
            raise NothingTrainedError(result)
        return result

    # -- the pieces of the run, in the order it uses them -------------------------------------------------------

    def _load_model(self) -> tuple[Any, Any, str]:
        from agentlightning.trainers.models import load_model, prepare_tokenizer

        if isinstance(self.config.model, str):
            model, tokenizer = load_model(self.config.model)
            return model, tokenizer, self.config.model.split("/")[-1]
        if self.config.tokenizer is None:
            raise ValueError("agl.train(model=<a loaded model>) also needs tokenizer=")
        prepare_tokenizer(self.config.tokenizer)
        name = getattr(self.config.model.config, "_name_or_path", "") or "policy"
        return self.config.model, self.config.tokenizer, str(name).split("/")[-1] or "policy"

    def _trl_settings(self) -> dict[str, Any]:
        """The ``grpo_config`` settings of the run: ``TrainConfig``'s, then ``trainer_args`` over them."""
        return dict(
            micro_batch_size=self.config.micro_batch_size,
            learning_rate=self.config.learning_rate,
            beta=self.config.beta,
            loss_type=self.config.loss_type,
            temperature=self.config.temperature,
            max_steps=self.config.max_steps,
            seed=self.config.seed,
            max_completion_length=self.config.max_completion_length or 512,
            # The HF backend samples from the very weights being trained, so the sampler/trainer importance ratio
            # is 1 up to float noise and the correction is off; a separate sampler (vLLM) or rollouts sampled by
            # older weights (max_staleness > 0) turn it on.
            **{
                "vllm_importance_sampling_correction": self.config.backend != "hf" or self.config.max_staleness > 0,
                **self.config.trainer_args,
            },
        )

    def _vllm_base_dir(self, model: Any, tokenizer: Any) -> Path | None:
        """The directory a vLLM server started here loads: ``model`` itself when it is one, else a saved copy."""
        if self.config.backend != "vllm" or self.config.vllm.url is not None:
            return None
        if isinstance(self.config.model, str) and Path(self.config.model).is_dir():
            return Path(self.config.model)
        path = self.output_dir / "vllm-base"
        model.save_pretrained(path)  # before TRL wraps it with a LoRA adapter
        tokenizer.save_pretrained(path)
        return path

    def _learner(self, model: Any, tokenizer: Any, config: Any, settings: dict[str, Any]) -> PolicySet:
        """The run's trainers: one over the model (``config``, made by ``grpo_config`` from ``settings``), or with
        ``policies`` one per policy's adapter, with the policy's learning rate."""
        from agentlightning.trainers.learner.grpo import grpo_config

        if self.policies is None:
            return PolicySet.of_one(model, tokenizer, config, peft_config=_lora_config(self.config.lora))
        policies = self.policies.policies
        adapters = {
            name: _lora_config(p.lora if p.lora is not None else (self.config.lora or True))
            for name, p in policies.items()
        }
        per_policy = {
            name: grpo_config(
                str(self.output_dir / "trl" / name),
                **{**settings, "learning_rate": p.learning_rate or settings["learning_rate"]},
            )
            for name, p in policies.items()
        }
        return PolicySet.of_adapters(model, tokenizer, self.policies, adapters, per_policy)

    def _restore(self, learner: PolicySet, ranks: Ranks) -> _RunState:
        """The state the run starts from: the checkpoint it resumes (loaded into ``learner`` on every rank), or a
        fresh start (which also starts a fresh metrics log in a reused directory)."""
        from agentlightning.trainers.checkpoint import latest_checkpoint, load_checkpoint

        checkpoint = ranks.resume_path(self._resume_path(latest_checkpoint) if ranks.main else None)
        if checkpoint is not None:
            return _RunState(load_checkpoint(learner, checkpoint), resumed=True)
        if ranks.main:
            for name in ("metrics.jsonl", "warnings.jsonl"):
                (self.output_dir / name).unlink(missing_ok=True)
        return _RunState({"step": 0, "order": [], "cursor": 0})

    def _resume_path(self, latest: Callable[[Path], Path | None]) -> Path | None:
        if self.config.resume is False or self.config.resume is None:
            return None
        if self.config.resume is True:
            found = latest(self.output_dir)
            if found is None:
                logger.info("resume=True but %s has no checkpoint yet: starting fresh", self.output_dir)
            return found
        path = Path(self.config.resume)
        if not path.exists():
            raise FileNotFoundError(f"agl.train(resume={str(self.config.resume)!r}): no such checkpoint directory")
        return path

    def _start_backend(
        self, learner: PolicySet, policy: Any, tokenizer: Any, model_name: str, state: _RunState, base_dir: Any
    ) -> Backend:
        """The started backend, serving the weights the run starts from at their versions, at the training
        temperature."""
        version = str(state.values.get("model_version", "v0"))
        backend = make_backend(self.config, policy, tokenizer, model_name, version, base_dir, self.policies).start()
        if self.policies is not None:
            for name, steps in learner.steps.items():  # each adapter served at its (resumed) version
                with backend.updating(f"v{steps}", policy=name):
                    pass
        elif state.resumed and self.config.backend != "hf":
            with backend.updating(backend.model_version):
                pass  # the server started from the initial weights: push the resumed ones
        backend.sampling_overrides = {"temperature": self.config.temperature}
        return backend

    def _rollout_source(self) -> Any:
        from agentlightning.trainers.rollouts import LocalRollouts, ServerRollouts

        if self.source is not None:
            return self.source
        if self.config.use_server:
            return ServerRollouts(
                self.agent,
                self.output_dir / "store.db",
                self.config.nworkers,
                rollout_timeout=self.config.rollout_timeout,
                workers=self.config.workers,
            )
        return LocalRollouts(self.agent, self.config.nworkers)

    def _pipeline(self, source: Any, sampler: _TaskSampler, state: _RunState) -> RolloutPipeline:
        return RolloutPipeline(
            source,
            self.dataset,
            sampler.next,
            tasks_per_step=self.config.tasks_per_step,
            group_size=self.config.group_size,
            max_staleness=self.config.max_staleness,
            refill_cap=self.config.refill_cap,
            timeout=self.config.rollout_timeout,  # from each rollout's start: queued ones are not hung
            roles=self.policies.trained_roles if self.policies else self.config.roles,
            credit=self.policies.credit(self.config.credit) if self.policies else self.config.credit,
            air=self.config.air,
            algorithm=self.config.algorithm,
            backlog=state.values.get("pending") or (),
            max_steps=self.config.max_steps,
            policy_of=self.policies.policy_of if self.policies else None,
        )

    def _result(self, steps: _Steps, policy: Any, tokenizer: Any) -> TrainResult:
        """What the run returns, after saving the final model (``save_model``) and the reward curve."""
        from agentlightning.trainers.reporting import plot_curve

        model_path = None
        if self.config.save_model:
            model_path = self.output_dir / "model"
            policy.save_pretrained(model_path)
            tokenizer.save_pretrained(model_path)
        history = steps.history
        return TrainResult(
            output_dir=self.output_dir,
            steps=int(history[-1]["step"]) if history else 0,
            model_version=steps.backend.model_version,
            history=history,
            initial_validation=steps.initial_validation,
            final_validation=steps.final_validation,
            metrics_path=steps.writer.path,
            curve_path=plot_curve(history, self.output_dir / "reward_curve.png"),
            checkpoint_path=steps.checkpoint_path,
            model_path=model_path,
            model=policy,
            tokenizer=tokenizer,
        )


@dataclass
class _RunState:
    """The loop state a run starts from: a checkpoint's ``state.json`` (step, task order and cursor, pending
    groups, model version, initial validation) or a fresh start's."""

    values: dict[str, Any]
    resumed: bool = False


@dataclass
class _Steps:
    """The steps of a run, from the state it starts from to ``max_steps`` or the early stop: each step trains on
    its rollouts, then is validated, written, shown and checkpointed when due."""

    training: TrainingRun
    learner: PolicySet
    backend: Backend
    source: Any
    pipeline: RolloutPipeline
    writer: MetricsWriter
    sampler: _TaskSampler
    ranks: Ranks
    state: _RunState
    started: float
    history: list[dict[str, Any]] = field(default_factory=list)
    initial_validation: dict[str, float] | None = None
    final_validation: dict[str, float] | None = None
    checkpoint_path: Path | None = None

    def __post_init__(self) -> None:
        from agentlightning.trainers.reporting import read_metrics

        self.config = self.training.config
        self.history = read_metrics(self.writer.path)
        self.initial_validation = self.state.values.get("initial_validation")

    def run(self) -> None:
        self._serve()
        if self.training.val_dataset and self.initial_validation is None:
            self._validate_initial()
        progress = _progress(self.config.progress, int(self.state.values["step"]), self.config.max_steps)
        try:
            for step in range(int(self.state.values["step"]), self.config.max_steps):
                row = self.train_step(step)
                if self._validation_due(step):
                    self._validate_into(row, step)
                row["elapsed_seconds"] = time.perf_counter() - self.started  # since run(), validation included
                self.writer.write(row)
                self.history.append(row)
                if progress is not None:
                    progress.update(1)
                    progress.set_postfix(_postfix(row, self.config.max_staleness > 0), refresh=False)
                stop = self._reached_target(row)
                if self._checkpoint_due(step) or stop or step + 1 == self.config.max_steps:
                    self.checkpoint_path = self.checkpoint(step + 1)
                if stop:
                    logger.info(
                        "held-out accuracy %.3f >= %s: stopping after step %d",
                        row["val/accuracy"],
                        self.config.stop_accuracy,
                        step + 1,
                    )
                    break
        finally:
            if progress is not None:
                progress.close()

    # -- one step -----------------------------------------------------------------------------------------------

    def train_step(self, step: int) -> dict[str, Any]:
        """Step ``step`` (0-based): its rollouts, the update of every policy with signal, the weights served."""
        started = time.perf_counter()
        served_version = self.backend.model_version
        on_version = _served_versions(self.backend, self.training.policies) or served_version
        data = self.pipeline.next_step(step, self.learner.trained_version)
        row: dict[str, Any] = {"step": step + 1, "model_version": served_version}
        row.update(self._rollout_metrics(data.rollouts, on_version))
        row["transitions"] = len(data.transitions)
        row["rollout_seconds"] = time.perf_counter() - started
        row.update(data.metrics)
        row.update(role_metrics(data.rollouts, data.transitions))
        row["warnings"] = list(data.warnings)  # in metrics.jsonl: the dashboard shows why nothing trained
        options = UpdateOptions(
            max_prompt_length=self.config.max_prompt_length,
            max_completion_length=self.config.max_completion_length,
            drop_zero_variance_groups=self.config.algorithm in GROUP_BASELINES,
            asynchronous=self.config.max_staleness > 0,
        )
        row.update(self.learner.update(data.transitions, self.backend, options, self.ranks))
        if row.get("skipped_update"):
            reason = _nothing_to_train(row, len(data.transitions), several=self.training.policies is not None)
            logger.warning("step %d: %s", step + 1, reason, extra={STEP_WARNING: step + 1})
            row["warnings"].append(reason)
        row.update(self.learner.rewards(data.rollouts, self.config.credit, self.config.air))
        self._serve()
        row["model_version_after"] = self.backend.model_version
        row["step_seconds"] = time.perf_counter() - started
        return row

    # -- validation -----------------------------------------------------------------------------------------------

    def _validate_initial(self) -> None:
        self.initial_validation = self.validate("initial")
        logger.info("held-out before training: %s", _fmt(self.initial_validation))
        row = {
            "step": 0,
            "model_version": self.backend.model_version,
            "elapsed_seconds": time.perf_counter() - self.started,
            **{f"val/{key}": value for key, value in self.initial_validation.items()},
        }
        self.writer.write(row)
        self.history.append(row)

    def _validation_due(self, step: int) -> bool:
        every = self.config.val_every
        last = step + 1 == self.config.max_steps
        return bool(self.training.val_dataset) and ((every and (step + 1) % every == 0) or last)

    def _validate_into(self, row: dict[str, Any], step: int) -> None:
        started = time.perf_counter()
        self.pipeline.drain()  # training rollouts still running must not be sampled at the validation temperature
        self.final_validation = self.validate(f"step {step + 1}")
        row.update({f"val/{key}": value for key, value in self.final_validation.items()})
        row["val_seconds"] = time.perf_counter() - started

    def validate(self, label: str) -> dict[str, float]:
        """Reward, accuracy and failures on the held-out tasks, sampled at the validation temperature."""
        assert self.training.val_dataset is not None
        self.backend.sampling_overrides = {"temperature": self.config.val_temperature}
        self._serve()
        try:
            rollouts = self.source.run(
                list(self.training.val_dataset), 1, f"val-{label.replace(' ', '')}", self.config.rollout_timeout
            )
        finally:
            self.backend.sampling_overrides = {"temperature": self.config.temperature}
            self._serve()
        metrics = self._rollout_metrics(rollouts, self.backend.model_version)
        kept: dict[str, float] = {key: metrics[key] for key in ("reward", "accuracy", "failed") if key in metrics}
        # What each policy is rewarded for (its credit) on the held-out tasks.
        kept.update(self.learner.rewards(rollouts, self.config.credit, self.config.air))
        return kept

    def _serve(self) -> None:
        """Point the rollouts at what the backend serves now, with its sampling overrides and the answer length cap
        (the proxy enforces them) and each role's policy (``policies=``)."""
        backend, policies = self.backend, self.training.policies
        routes = serving_routes(policies, backend.served) if policies is not None else ()
        self.source.set_model(
            backend.base_url,
            backend.model_name,
            backend.model_version,
            dict(backend.sampling_overrides),
            max_tokens_limit=self.config.max_completion_length,
            routes=routes,
        )

    def _rollout_metrics(self, rollouts: Any, version: str | dict[str | None, str]) -> dict[str, Any]:
        threshold = self.config.success_threshold
        judge = self.config.accuracy or (lambda rollout: (rollout.final_reward or 0.0) >= threshold)
        return rollout_metrics(rollouts, version, judge)

    # -- stop and checkpoints -------------------------------------------------------------------------------------

    def _reached_target(self, row: dict[str, Any]) -> bool:
        target = self.config.stop_accuracy
        return target is not None and row.get("val/accuracy", -1.0) >= target

    def _checkpoint_due(self, step: int) -> bool:
        every = self.config.checkpoint_every
        return bool(every) and (step + 1) % every == 0

    def checkpoint(self, step: int) -> Path:
        """Save the run after ``step`` steps (the other ranks help gather sharded weights)."""
        from agentlightning.trainers.checkpoint import save_checkpoint

        trainer = self.learner.first
        return save_checkpoint(
            self.learner,
            self.training.output_dir,
            {
                "step": step,
                "global_step": self.learner.trained_version,
                "model_version": self.backend.model_version,
                "order": self.sampler.order,
                "cursor": self.sampler.cursor,
                "pending": self.pipeline.pending_indices(),
                "initial_validation": self.initial_validation,
            },
            notify=lambda directory: self.ranks.send_checkpoint(trainer, directory),
        )


def _served_versions(backend: Backend, policies: PolicyMap | None) -> dict[str | None, str] | None:
    """The version each policy (None: the base) is served at now, with ``policies``."""
    if policies is None:
        return None
    return {name: backend.served(name)[1] for name in [None, *policies.policies]}


class _TaskSampler:
    """Walks through the dataset in epochs, shuffled or in order (state saved in checkpoints)."""

    def __init__(self, size: int, seed: int, order: list[int] | None, cursor: int, shuffle: bool = True) -> None:
        self.size = size
        self.shuffle = shuffle
        self.rng = random.Random(seed + cursor)
        self.order = order if order and len(order) == size else self._epoch()
        self.cursor = cursor

    @classmethod
    def resumed(cls, size: int, config: TrainConfig, state: dict[str, Any]) -> _TaskSampler:
        """The sampler over ``size`` tasks where ``state`` (a checkpoint's, or a fresh run's) left it."""
        order = state.get("order") or None
        return cls(size, config.seed, order, int(state.get("cursor", 0)), shuffle=config.shuffle_dataset)

    def _epoch(self) -> list[int]:
        order = list(range(self.size))
        if self.shuffle:
            self.rng.shuffle(order)
        return order

    def next(self, count: int) -> list[int]:
        chosen = []
        for _ in range(count):
            if self.cursor >= len(self.order):
                self.order, self.cursor = self._epoch(), 0
            chosen.append(self.order[self.cursor])
            self.cursor += 1
        return chosen


def _lora_config(lora: Any) -> Any:
    if lora is None or lora is False:
        return None
    from peft import LoraConfig

    if isinstance(lora, LoraConfig):
        return lora
    settings: dict[str, Any] = {
        "r": 16,
        "lora_alpha": 32,
        "lora_dropout": 0.0,
        "task_type": "CAUSAL_LM",
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    }
    if isinstance(lora, dict):
        settings.update(lora)
    elif lora is not True:
        raise TypeError(f"agl.train(lora={lora!r}): use None, True, a dict of LoraConfig fields, or a LoraConfig")
    return LoraConfig(**settings)


def _progress(enabled: bool, start: int, total: int) -> Any:
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=start, desc="agl.train", unit="step", dynamic_ncols=True)


def _postfix(row: dict[str, Any], asynchronous: bool = False) -> dict[str, str]:
    shown = {"reward": row.get("reward"), "acc": row.get("accuracy")}
    if "val/accuracy" in row:
        shown["val_acc"] = row["val/accuracy"]
    text = {key: f"{value:.2f}" for key, value in shown.items() if isinstance(value, (int, float))}
    if asynchronous and "async/queue_depth" in row:  # version lag mean/max, groups ahead, dropped, waits (s)
        text["lag"] = f"{row['async/staleness_mean']:.1f}/{row['async/staleness_max']:.0f}"
        text["queue"] = f"{row['async/queue_depth']:.0f}"
        text["stale"] = f"{row['async/dropped_stale_total']:.0f}"
        text["wait"] = f"{row['async/trainer_wait_seconds']:.0f}/{row['async/sampler_wait_seconds']:.0f}"
    return text


def _nothing_to_train(row: dict[str, Any], transitions: int, several: bool) -> str:
    """Why a step trained nothing, in plain words (the warnings before it say what extraction skipped)."""
    if several:
        return "no policy had anything to train on: the adapters are unchanged"
    if not transitions:
        return "nothing to train on (no transitions): the model is unchanged"
    ties = row.get("batch/dropped_zero_variance_groups", 0)
    if ties:
        return (
            f"nothing to train on: every rollout of a group got the same reward ({ties} groups; GRPO learns from "
            "the differences within a group): the model is unchanged"
        )
    return f"nothing to train on ({transitions} transitions, none kept by the batch): the model is unchanged"


def _fmt(values: dict[str, float] | None) -> str:
    return ", ".join(f"{key}={value:.3f}" for key, value in (values or {}).items())
