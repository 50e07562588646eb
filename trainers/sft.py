"""Rejection-sampling fine-tuning from captured traces: keep the rollouts whose reward passes a threshold, turn
each of their LLM calls into a chat-format SFT row carrying the exact token ids that were captured (never
re-tokenised), and train a LoRA adapter on them with TRL's ``SFTTrainer`` (loss on the completion tokens only).

It writes the LoRA adapter (``<output_dir>/adapter``) and the base model with the adapter merged in
(``<output_dir>/model``, full weights): that directory is the starting point of ``agl.train(model=<output_dir>/model)``
(a LoRA run then trains a fresh adapter over the fine-tuned weights, and its saved adapter names that directory as
its base, so the run's model reloads whole). ``load_model`` also loads an adapter directory by merging it into its
base.

Rollouts come from any run: a training run's directory or its ``store.db`` (validation rollouts, group ids
``val-*``, are left out: they are held-out tasks), a JSON-lines file of rollouts (``agl.evaluate`` reports'
rollouts, ``examples.common.write_rollouts``), or a list of ``agl.Rollout``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentlightning.trainers.loop import _lora_config
from agentlightning.trainers.models import load_model, prepare_tokenizer

from agentlightning.errors import NoSFTRowsError
from agentlightning.rl.transitions import transitions
from agentlightning.types import Rollout

logger = logging.getLogger(__name__)

HELD_OUT_GROUP_PREFIX = "val-"
"""Group ids of a training run's validation rollouts (held-out tasks: never trained on)."""


@dataclass
class SFTResult:
    """What :func:`sft` produced."""

    adapter_dir: Path
    model_dir: Path
    """The base model with the adapter merged in: give it to ``agl.train(model=...)``."""
    rows: int
    rollouts: int
    losses: list[float] = field(default_factory=list)
    """Training loss at each logged step (one per optimizer step)."""
    rows_path: Path | None = None

    def summary(self) -> str:
        """A few lines for a terminal."""
        loss = f"loss {self.losses[0]:.4f} -> {self.losses[-1]:.4f}" if self.losses else "no loss logged"
        return (
            f"SFT on {self.rows} rows from {self.rollouts} rollouts: {loss}\n"
            f"adapter: {self.adapter_dir}; merged model: {self.model_dir} "
            f"(start GRPO from it: agl.train(..., model={str(self.model_dir)!r}))"
        )


def read_rollouts(source: str | Path | Iterable[Rollout]) -> list[Rollout]:
    """The finished rollouts of ``source``: a run directory (its ``store.db``), a store file, a JSON-lines file
    of rollouts, or rollouts already in memory."""
    if not isinstance(source, (str, Path)):
        return list(source)
    path = Path(source)
    if path.is_dir():
        path = path / "store.db"
    if not path.is_file():
        raise FileNotFoundError(f"{source}: no store.db or rollouts file there (a run directory of agl.train?)")
    if path.suffix in (".jsonl", ".json"):
        with open(path, encoding="utf-8") as handle:
            return [Rollout.model_validate_json(line) for line in handle if line.strip()]
    from agentlightning.server.store import SQLiteStore

    found: list[Rollout] = []
    with contextlib.closing(SQLiteStore(path)) as store:
        offset = 0
        while page := store.list_rollouts(status="succeeded", limit=500, offset=offset):
            offset += len(page)
            found.extend(rollout for s in page if (rollout := store.get_rollout(s.rollout_id)) is not None)
    return found


def select_rollouts(
    rollouts: Sequence[Rollout], min_reward: float, task_ids: Iterable[str] | None = None
) -> list[Rollout]:
    """Succeeded rollouts with ``final_reward >= min_reward``, none of a validation group, of ``task_ids`` (when
    given); raises :class:`NoSFTRowsError` when none is left."""
    allowed = None if task_ids is None else set(task_ids)
    kept, dropped = [], {"not succeeded": 0, "reward below threshold": 0, "held-out (validation)": 0, "other task": 0}
    for rollout in rollouts:
        if rollout.status != "succeeded":
            dropped["not succeeded"] += 1
        elif str(rollout.group_id or "").startswith(HELD_OUT_GROUP_PREFIX):
            dropped["held-out (validation)"] += 1
        elif allowed is not None and rollout.task_id not in allowed:
            dropped["other task"] += 1
        elif rollout.final_reward is None or rollout.final_reward < min_reward:
            dropped["reward below threshold"] += 1
        else:
            kept.append(rollout)
    if not kept:
        reasons = ", ".join(f"{count} {why}" for why, count in dropped.items() if count) or "no rollouts at all"
        raise NoSFTRowsError(f"no rollout of the {len(rollouts)} read has reward >= {min_reward} ({reasons})")
    return kept


def sft_rows(rollouts: Sequence[Rollout], roles: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """One row per LLM call of ``roles`` (all when None) in ``rollouts``: ``messages`` (the call's chat input and
    its reply, for reading), ``input_ids`` (the captured prompt ids then completion ids) and ``completion_mask``
    (1 on the completion). Calls without captured token ids are skipped (and logged); identical rows (the same
    ids twice) are kept once."""
    calls = {call.call_id: call for rollout in rollouts for call in rollout.llm_calls}
    rows, seen = [], set()
    for transition in transitions(rollouts, roles=roles, failed="exclude"):
        key = (tuple(transition.prompt_token_ids), tuple(transition.completion_token_ids))
        if key in seen:
            continue
        seen.add(key)
        call = calls[transition.call_id] if transition.call_id in calls else None
        rows.append(
            {
                "rollout_id": transition.rollout_id,
                "task_id": transition.task_id,
                "call_id": transition.call_id,
                "role": transition.role,
                "reward": transition.reward,
                "token_source": transition.token_source,
                "messages": _chat(call),
                "input_ids": [*transition.prompt_token_ids, *transition.completion_token_ids],
                "completion_mask": [0] * len(transition.prompt_token_ids) + [1] * len(transition.completion_token_ids),
            }
        )
    return rows


def sft(
    source: str | Path | Iterable[Rollout],
    model: Any = "smollm2",
    *,
    min_reward: float = 1.0,
    roles: Sequence[str] | None = None,
    task_ids: Iterable[str] | None = None,
    tokenizer: Any = None,
    output_dir: str | Path = "runs/sft",
    lora: Any = True,
    epochs: float = 2.0,
    learning_rate: float = 2e-4,
    batch_size: int = 8,
    max_length: int | None = None,
    seed: int = 0,
    trainer_args: dict[str, Any] | None = None,
) -> SFTResult:
    """Fine-tune ``model`` on the successful rollouts of ``source`` (see the module docstring) and write the LoRA
    adapter to ``<output_dir>/adapter`` (with the rows in ``<output_dir>/sft_rows.jsonl``).

    ``min_reward``: rollouts below it are dropped; ``roles``: whose calls become rows (default all); ``task_ids``:
    only these tasks (e.g. the training split); ``lora``: as ``agl.train``'s; ``trainer_args``: more
    ``trl.SFTConfig`` fields.
    """
    rollouts = read_rollouts(source)
    kept = select_rollouts(rollouts, min_reward, task_ids)
    rows = sft_rows(kept, roles)
    if not rows:
        raise NoSFTRowsError(f"the {len(kept)} rollouts with reward >= {min_reward} have no LLM call with token ids")
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    rows_path = output_dir / "sft_rows.jsonl"
    with open(rows_path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    logger.info("SFT: %d rows from %d of %d rollouts (reward >= %s)", len(rows), len(kept), len(rollouts), min_reward)
    policy, tokenizer = _policy(model, tokenizer)
    losses = train_rows(
        policy,
        tokenizer,
        rows,
        output_dir / "adapter",
        lora=lora,
        epochs=epochs,
        learning_rate=learning_rate,
        batch_size=batch_size,
        max_length=max_length,
        seed=seed,
        trainer_args=trainer_args,
        base_name=model if isinstance(model, str) else None,
    )
    model_dir = save_merged(output_dir / "adapter", output_dir / "model")
    return SFTResult(output_dir / "adapter", model_dir, len(rows), len(kept), losses, rows_path)


def save_merged(adapter_dir: Path, model_dir: Path) -> Path:
    """Merge the adapter of ``adapter_dir`` into its base model and save the whole model (and tokenizer) to
    ``model_dir``."""
    model, tokenizer = load_model(str(adapter_dir))
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    return model_dir


def train_rows(
    model: Any,
    tokenizer: Any,
    rows: Sequence[dict[str, Any]],
    adapter_dir: Path,
    *,
    lora: Any = True,
    epochs: float = 2.0,
    learning_rate: float = 2e-4,
    batch_size: int = 8,
    max_length: int | None = None,
    seed: int = 0,
    trainer_args: dict[str, Any] | None = None,
    base_name: str | None = None,
) -> list[float]:
    """Train a LoRA adapter of ``model`` on ``rows`` (their ``input_ids`` and ``completion_mask`` as they are) with
    ``trl.SFTTrainer``, save it (and the tokenizer) to ``adapter_dir``; return the loss of each logged step."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    peft_config = _lora_config(lora)
    if peft_config is None:
        raise ValueError("sft(lora=None): rejection-sampling SFT trains a LoRA adapter; give lora=True or a config")
    dataset = Dataset.from_list([{"input_ids": r["input_ids"], "completion_mask": r["completion_mask"]} for r in rows])
    args = SFTConfig(
        output_dir=str(adapter_dir.parent / "trl"),
        num_train_epochs=epochs,
        per_device_train_batch_size=batch_size,
        learning_rate=learning_rate,
        completion_only_loss=True,
        max_length=max_length,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=seed,
        dataset_num_proc=None,
        use_cpu=not _cuda(),
        **(trainer_args or {}),
    )
    trainer = SFTTrainer(
        model=model, args=args, train_dataset=dataset, processing_class=tokenizer, peft_config=peft_config
    )
    trainer.train()
    losses = [float(entry["loss"]) for entry in trainer.state.log_history if "loss" in entry]
    if not all(math.isfinite(loss) for loss in losses):
        raise FloatingPointError(f"SFT loss is not finite: {losses}")
    trainer.model.save_pretrained(adapter_dir)
    tokenizer.save_pretrained(adapter_dir)
    if base_name is not None:  # the name the user gave ("smollm2"), not the cache directory it resolved to
        config_path = adapter_dir / "adapter_config.json"
        config = json.loads(config_path.read_text(encoding="utf-8"))
        config["base_model_name_or_path"] = base_name
        config_path.write_text(json.dumps(config, indent=2), encoding="utf-8")
    return losses


def _policy(model: Any, tokenizer: Any) -> tuple[Any, Any]:
    if isinstance(model, (str, Path)):
        return load_model(str(model))
    if tokenizer is None:
        raise ValueError("sft(model=<a loaded model>) also needs tokenizer=")
    return model, prepare_tokenizer(tokenizer)


def _chat(call: Any) -> list[dict[str, Any]]:
    """The call's input messages and its reply as one chat (the reply's tool calls included)."""
    if call is None:
        return []
    messages = list(call.input) if isinstance(call.input, list) else []
    output = call.output if isinstance(call.output, dict) else {"content": call.output}
    reply: dict[str, Any] = {"role": "assistant", "content": output.get("content")}
    if output.get("tool_calls"):
        reply["tool_calls"] = output["tool_calls"]
    return [*messages, reply]


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
