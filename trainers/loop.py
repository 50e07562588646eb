"""The training loop behind ``agl.train``: rollouts -> transitions -> advantages -> packed batch -> TRL update.

:class:`TrainingRun` owns the pieces for the length of one run: the policy model and its
:class:`~agentlightning.trainers.learner.grpo.LightningGRPOTrainer`, the backend serving the live weights (HF) or kept in sync
with them (vLLM; :func:`make_backend`, behind :class:`~agentlightning.trainers.backends.base.Backend`), the rollout source
(Lightning Server + workers, or in-process), the metrics writer and checkpoints. Model versions are ``v<step>``:
``v0`` is the initial model, and a call recorded with ``v3`` was sampled from the weights after the third update. Each
step's groups come from a :class:`~agentlightning.trainers._pipeline.RolloutPipeline`, which with
``max_staleness > 0`` runs the rollouts of the next steps while a step trains. With ``policies=`` (one LoRA adapter
per role), the trainer is a :class:`~agentlightning.trainers.learner._policy_set.PolicySet` and each policy has its own update
and version.
"""

from __future__ import annotations

import logging
import random
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentlightning.trainers._pipeline import RolloutPipeline, timed
from agentlightning.trainers.config import NothingTrainedError, TrainConfig, TrainResult
from agentlightning.trainers.learner._distributed import Ranks, served_model
from agentlightning.trainers.learner.batch import pack
from agentlightning.trainers.policies import PolicyMap, serving_routes

from agentlightning._decorator import RolloutAgent
from agentlightning.rl.advantages import GROUP_BASELINES
from agentlightning.types import Rollout

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
        if isinstance(dataset, (str, bytes, dict)) or not isinstance(dataset, Sequence) or not dataset:
            raise ValueError(f"agl.train(dataset=...) must be a non-empty list of tasks, got {type(dataset).__name__}")
        self.agent, self.dataset, self.config = agent, dataset, config
        self.val_dataset, self.source = val_dataset, source
        self.output_dir = Path(config.output_dir)
        self.policies = (
            None if config.policies is None else PolicyMap.parse(config.policies, getattr(agent, "roles", None))
        )
        self._policy_set: Any = None

    # -- the run ------------------------------------------------------------------------------------------------

    def run(self) -> TrainResult:
        from agentlightning.trainers.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
        from agentlightning.trainers.learner.grpo import grpo_config
        from agentlightning.trainers.reporting import MetricsWriter, plot_curve, read_metrics

        run_started = time.perf_counter()
        self.output_dir.mkdir(parents=True, exist_ok=True)
        model, tokenizer, model_name = self._load_model()
        settings: dict[str, Any] = dict(
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
        config = grpo_config(str(self.output_dir / "trl"), **settings)
        ranks = Ranks()  # after the TRL config, whose process-group settings it applies; rank 0 runs the loop
        if self.policies is not None and ranks.count > 1:
            raise NotImplementedError("agl.train(policies=...) runs in one process, not under `accelerate launch`")
        base_dir = self._vllm_base_dir(model, tokenizer) if ranks.main else None
        trainer = self._trainer(model, tokenizer, config, settings)
        policy = served_model(trainer, self.config)

        checkpoint = ranks.resume_path(self._resume_path(latest_checkpoint) if ranks.main else None)
        state: dict[str, Any] = {"step": 0, "order": [], "cursor": 0}
        if checkpoint is not None:
            state = load_checkpoint(trainer, checkpoint)
        elif ranks.main and (self.output_dir / "metrics.jsonl").exists():
            (self.output_dir / "metrics.jsonl").unlink()  # a fresh run in a reused directory starts a fresh log
        if not ranks.main:
            return ranks.follow(trainer, tokenizer)
        start_step = int(state["step"])
        sampler = _TaskSampler(
            len(self.dataset),
            self.config.seed,
            state.get("order") or None,
            int(state.get("cursor", 0)),
            shuffle=self.config.shuffle_dataset,
        )

        backend = make_backend(
            self.config, policy, tokenizer, model_name, str(state.get("model_version", "v0")), base_dir, self.policies
        ).start()
        if self.policies is not None:
            for name, steps in trainer.steps.items():  # each adapter served at its (resumed) version
                with backend.updating(f"v{steps}", policy=name):
                    pass
        elif checkpoint is not None and self.config.backend != "hf":
            with backend.updating(backend.model_version):
                pass  # the server started from the initial weights: push the resumed ones
        backend.sampling_overrides = {"temperature": self.config.temperature}
        writer = MetricsWriter(self.output_dir, self.config.report_to, run_name=self.output_dir.name)
        source = self._rollout_source()
        pipeline = RolloutPipeline(
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
            backlog=state.get("pending") or (),
            max_steps=self.config.max_steps,
            policy_of=self.policies.policy_of if self.policies else None,
        )
        history = read_metrics(writer.path)
        initial_val = state.get("initial_validation")
        final_val: dict[str, float] | None = None
        checkpoint_path: Path | None = None
        try:
            _serve(source, backend)
            if self.val_dataset and initial_val is None:
                initial_val = self._validate_policy(source, backend, "initial")
                logger.info("held-out before training: %s", _fmt(initial_val))
                start_row = {
                    "step": 0,
                    "model_version": backend.model_version,
                    "elapsed_seconds": time.perf_counter() - run_started,
                    **{f"val/{key}": value for key, value in initial_val.items()},
                }
                writer.write(start_row)
                history.append(start_row)
            bar = _progress(self.config.progress, start_step, self.config.max_steps)
            for step in range(start_step, self.config.max_steps):
                row = self._train_step(step, trainer, backend, source, pipeline, ranks)
                if self.val_dataset and (
                    (self.config.val_every and (step + 1) % self.config.val_every == 0)
                    or step + 1 == self.config.max_steps
                ):
                    val_started = time.perf_counter()
                    final_val = self._validate_policy(source, backend, f"step {step + 1}", pipeline)
                    row.update({f"val/{key}": value for key, value in final_val.items()})
                    row["val_seconds"] = time.perf_counter() - val_started
                row["elapsed_seconds"] = time.perf_counter() - run_started  # since run(), validation included
                writer.write(row)
                history.append(row)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(_postfix(row, self.config.max_staleness > 0), refresh=False)
                target = self.config.stop_accuracy
                stop = target is not None and row.get("val/accuracy", -1.0) >= target
                last = step + 1 == self.config.max_steps or stop
                if (self.config.checkpoint_every and (step + 1) % self.config.checkpoint_every == 0) or last:
                    checkpoint_path = save_checkpoint(
                        trainer,
                        self.output_dir,
                        {
                            "step": step + 1,
                            "global_step": trainer.steps if self.policies else trainer.state.global_step,
                            "model_version": backend.model_version,
                            "order": sampler.order,
                            "cursor": sampler.cursor,
                            "pending": pipeline.pending_indices(),
                            "initial_validation": initial_val,
                        },
                        notify=lambda directory: ranks.send_checkpoint(trainer, directory),
                    )
                if stop:
                    logger.info(
                        "held-out accuracy %.3f >= %s: stopping after step %d", row["val/accuracy"], target, step + 1
                    )
                    break
            if bar is not None:
                bar.close()
        except BaseException as error:
            ranks.abort(trainer, error)
            raise
        finally:
            pipeline.close()
            source.close()
            backend.stop()
            writer.close()
        model_path = None
        if self.config.save_model:
            model_path = self.output_dir / "model"
            policy.save_pretrained(model_path)
            tokenizer.save_pretrained(model_path)
        curve = plot_curve(history, self.output_dir / "reward_curve.png")
        result = TrainResult(
            output_dir=self.output_dir,
            steps=int(history[-1]["step"]) if history else 0,
            model_version=backend.model_version,
            history=history,
            initial_validation=initial_val,
            final_validation=final_val,
            metrics_path=writer.path,
            curve_path=curve,
            checkpoint_path=checkpoint_path,
            model_path=model_path,
            model=policy,
            tokenizer=tokenizer,
        )
        ranks.finish(result)
        logger.info("training finished:\n%s", result.summary())
        if result.steps and not result.updated_steps and not self.config.allow_no_update:
            raise NothingTrainedError(result)
        return result

    def _train_step(
        self, step: int, trainer: Any, backend: Any, source: Any, pipeline: RolloutPipeline, ranks: Ranks
    ) -> dict[str, Any]:
        started = time.perf_counter()
        served_version = backend.model_version
        on_version = _served_versions(backend, self.policies) or served_version
        data = pipeline.next_step(step, trainer.steps if self.policies else trainer.state.global_step)
        rollout_seconds = time.perf_counter() - started
        transitions = data.transitions
        row: dict[str, Any] = {"step": step + 1, "model_version": served_version}
        row.update(self._rollout_metrics(data.rollouts, "", on_version))
        row["transitions"] = len(transitions)
        row["rollout_seconds"] = rollout_seconds
        row.update(data.metrics)
        row["warnings"] = list(data.warnings)  # in metrics.jsonl: the dashboard shows why nothing trained
        if self.policies is not None:  # each policy's own batch, update and version
            row.update(
                trainer.update(
                    transitions,
                    backend,
                    self.config.max_prompt_length,
                    self.config.max_completion_length,
                    self.config.algorithm,
                )
            )
            if row.get("skipped_update"):
                row["warnings"].append("no policy had anything to train on: the adapters are unchanged")
            row.update(trainer.rewards(data.rollouts, self.config.credit, self.config.air))
            _serve(source, backend)
            row["model_version_after"] = backend.model_version
            row["step_seconds"] = time.perf_counter() - started
            return row
        batch = (
            pack(
                transitions,
                tokenizer_pad(trainer),
                self.config.max_prompt_length,
                self.config.max_completion_length,
                drop_zero_variance_groups=self.config.algorithm in GROUP_BASELINES,
            )
            if transitions
            else None
        )
        if batch is None or len(batch) == 0:
            logger.warning(
                "step %d: nothing to train on (%d transitions; every group had equal rewards, was too stale or no "
                "tokens were captured) — the model is unchanged",
                step + 1,
                len(transitions),
            )
            row["skipped_update"] = 1
            row["warnings"].append(_nothing_to_train(transitions, batch))
            # The step still counts: the optimizer schedule and the version do not move.
            return row
        new_version = f"v{trainer.state.global_step + 1}"
        ranks.send_step(trainer, batch)  # every rank trains on its shard of the batch
        beside = self.config.max_staleness > 0 and _decodes_beside_updates(backend)
        if beside and not (self.config.beta and self.config.lora):
            # Rollouts keep generating through the forward and backward passes; only the optimizer step pauses
            # them (with a LoRA reference, disabling the adapter for the KL term would change what they see).
            pauses: list[float] = []
            metrics = trainer.step(batch, weights_changing=lambda: timed(backend.updating(new_version), pauses))
            synced = time.perf_counter()
            row["async/pause_seconds"] = sum(pauses)  # the optimizer step waiting for the calls in flight
        else:
            with backend.updating(new_version):
                metrics = trainer.step(batch)
                synced = time.perf_counter()
        row["sync_seconds"] = time.perf_counter() - synced  # pushing the weights to the backend (vLLM)
        if getattr(backend, "last_logprob_gap", None) is not None:
            row["sync/logprob_gap"] = backend.last_logprob_gap  # largest |sampler - trainer| logprob after the sync
        _serve(source, backend)
        row.update({f"train/{key}": value for key, value in metrics.items()})
        row.update({f"batch/{key}": value for key, value in batch.stats.as_dict().items()})
        row["model_version_after"] = backend.model_version
        row["step_seconds"] = time.perf_counter() - started
        return row

    def _validate_policy(
        self, source: Any, backend: Any, label: str, pipeline: RolloutPipeline | None = None
    ) -> dict[str, float]:
        assert self.val_dataset is not None
        if pipeline is not None:
            pipeline.drain()  # training rollouts still running must not be sampled at the validation temperature
        backend.sampling_overrides = {"temperature": self.config.val_temperature}
        _serve(source, backend)
        try:
            rollouts = source.run(
                list(self.val_dataset), 1, f"val-{label.replace(' ', '')}", self.config.rollout_timeout
            )
        finally:
            backend.sampling_overrides = {"temperature": self.config.temperature}
            _serve(source, backend)
        metrics = self._rollout_metrics(rollouts, "", backend.model_version)
        kept = {key: metrics[key] for key in ("reward", "accuracy", "failed") if key in metrics}
        if self._policy_set is not None:  # what each policy is rewarded for (its credit) on the held-out tasks
            kept.update(self._policy_set.rewards(rollouts, self.config.credit, self.config.air))
        return kept

    def _rollout_metrics(
        self, rollouts: Sequence[Rollout], prefix: str, version: str | dict[str | None, str]
    ) -> dict[str, Any]:
        """Reward, accuracy and call statistics; ``calls_on_version`` counts calls served by ``version`` (per
        policy: ``{policy: version}``)."""
        rewards = [rollout.final_reward if rollout.final_reward is not None else 0.0 for rollout in rollouts]
        judge = self.config.accuracy or (lambda rollout: (rollout.final_reward or 0.0) >= self.config.success_threshold)
        calls = [call for rollout in rollouts for call in rollout.llm_calls]
        completion_tokens = [len(call.completion_token_ids or []) for call in calls]
        return {
            f"{prefix}reward": statistics.fmean(rewards) if rewards else 0.0,
            f"{prefix}reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
            f"{prefix}accuracy": statistics.fmean(1.0 if judge(r) else 0.0 for r in rollouts) if rollouts else 0.0,
            f"{prefix}failed": float(sum(1 for r in rollouts if r.status != "succeeded")),
            f"{prefix}rollouts": float(len(rollouts)),
            f"{prefix}llm_calls": float(len(calls)),
            f"{prefix}completion_tokens_mean": statistics.fmean(completion_tokens) if completion_tokens else 0.0,
            f"{prefix}calls_on_version": float(
                sum(
                    1
                    for c in calls
                    if c.metadata.get("model_version")
                    == (version.get(c.metadata.get("policy")) if isinstance(version, dict) else version)
                )
            ),
        }

    # -- setup helpers --------------------------------------------------------------------------------------------

    def _trainer(self, model: Any, tokenizer: Any, config: Any, settings: dict[str, Any]) -> Any:
        """The TRL trainer of the run (``config``, made by ``grpo_config`` from ``settings``), or with ``policies``
        a PolicySet (one trainer per policy's adapter, with the policy's learning rate)."""
        from agentlightning.trainers.learner.grpo import LightningGRPOTrainer, grpo_config

        trl_dir = self.output_dir / "trl"
        if self.policies is None:
            return LightningGRPOTrainer(model, config, tokenizer, peft_config=_lora_config(self.config.lora))
        from agentlightning.trainers.learner._policy_set import PolicySet

        policies = self.policies.policies
        adapters = {
            name: _lora_config(p.lora if p.lora is not None else (self.config.lora or True))
            for name, p in policies.items()
        }
        per_policy = {
            name: grpo_config(
                str(trl_dir / name), **{**settings, "learning_rate": p.learning_rate or settings["learning_rate"]}
            )
            for name, p in policies.items()
        }
        self._policy_set = PolicySet(model, tokenizer, self.policies, adapters, per_policy)
        return self._policy_set

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


def make_backend(
    config: TrainConfig,
    policy: Any,
    tokenizer: Any,
    model_name: str,
    model_version: str,
    base_dir: Path | None,
    policies: PolicyMap | None = None,
) -> Any:
    """The :class:`~agentlightning.trainers.backends.base.Backend` that ``config.backend`` names, serving ``policy`` (not
    started), with one adapter per policy of ``policies``. ``base_dir`` is the initial model a vLLM server started
    here loads."""
    if config.backend == "hf":
        from agentlightning.trainers.backends.hf.server import HFBackendServer

        return HFBackendServer(
            policy,
            tokenizer,
            model_name=model_name,
            model_version=model_version,
            max_batch_size=config.max_batch_size,
            always_logprobs=True,
            default_max_tokens=config.max_completion_length or 512,
            policies=policies,
        )
    if config.backend == "vllm":
        from agentlightning.trainers.backends.vllm.server import VLLMBackend

        options = config.vllm
        return VLLMBackend(
            None if options.url else base_dir,
            url=options.url,
            policy=policy,
            tokenizer=tokenizer,
            sync=config.vllm_sync,  # type: ignore[arg-type]
            model_name=None if options.url else model_name,
            model_version=model_version,
            python=options.python,
            dtype=options.dtype,
            gpu_memory_utilization=options.gpu_memory_utilization,
            max_model_len=options.max_model_len,
            tensor_parallel_size=options.tensor_parallel_size,
            max_lora_rank=options.max_lora_rank,
            extra_args=options.extra_args,
            env=options.env,
            startup_timeout=options.startup_timeout,
            check_messages=_CHECK_MESSAGES if options.check_logprobs else None,
            keep_previous=config.max_staleness > 0,
            policies=policies,
        )
    if getattr(config.backend, "policy", policy) is None:
        config.backend.policy = policy  # a Backend instance built before the trainer existed
    if policies is not None and getattr(config.backend, "policies", None) is None:
        config.backend.policies = policies
    return config.backend


_CHECK_MESSAGES = [{"role": "user", "content": "What is 2 + 3? Answer briefly."}]
"""The conversation whose sampled tokens are scored by both sides after each vLLM sync."""


def _decodes_beside_updates(backend: Any) -> bool:
    """Whether ``backend`` generates from the trainer's own weights (the HF backend, not a copy as vLLM) in the mode
    they are in (not when it switches them to eval mode, which an update's forward passes would see)."""
    from agentlightning.trainers.backends.hf.server import HFBackendServer

    return isinstance(backend, HFBackendServer) and not backend.engine.decodes_in_eval


def _serve(source: Any, backend: Any) -> None:
    """Point the rollouts at what ``backend`` serves now, with its sampling overrides (the proxy enforces them) and
    each role's policy (``policies=``)."""
    policies = getattr(backend, "policies", None)
    routes = serving_routes(policies, backend.served) if policies is not None else ()
    source.set_model(
        backend.base_url, backend.model_name, backend.model_version, dict(backend.sampling_overrides), routes=routes
    )


def _served_versions(backend: Any, policies: PolicyMap | None) -> dict[str | None, str] | None:
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


def tokenizer_pad(trainer: Any) -> int:
    return int(trainer.processing_class.pad_token_id)


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


def _nothing_to_train(transitions: Sequence[Any], batch: Any) -> str:
    """Why a step had nothing to train on, in plain words (the warnings before it say what extraction skipped)."""
    if not transitions:
        return "nothing to train on (no transitions): the model is unchanged"
    ties = batch.stats.dropped_zero_variance_groups if batch is not None else 0
    if ties:
        return (
            f"nothing to train on: every rollout of a group got the same reward ({ties} groups; GRPO learns from "
            "the differences within a group): the model is unchanged"
        )
    return f"nothing to train on ({len(transitions)} transitions, none kept by the batch): the model is unchanged"


def _fmt(values: dict[str, float] | None) -> str:
    return ", ".join(f"{key}={value:.3f}" for key, value in (values or {}).items())
