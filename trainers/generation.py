"""Batched sampling for the in-process Hugging Face backend: exact token ids and per-token log-probabilities.

Concurrent requests are queued; one worker thread takes whatever is waiting (up to ``max_batch_size`` rows),
left-pads the prompts and decodes them together with a KV cache, each row with its own temperature, top-p,
top-k, seed, stop strings and token budget. Log-probabilities are those of the sampling distribution
(logits divided by the temperature, before top-p/top-k), which is what TRL's loss computes for the same tokens.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

logger = logging.getLogger(__name__)


@dataclass
class SamplingParams:
    """Per-request sampling settings (OpenAI names)."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None


@dataclass
class Sample:
    """One generated completion."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str  # "stop" | "length"
    model_version: str | None = None  # weights version that generated it


@dataclass
class _Row:
    prompt_ids: list[int]
    params: SamplingParams
    future: concurrent.futures.Future[Sample]


class GenerationEngine:
    """Serves :meth:`submit` calls from many threads with batched decoding on ``model``.

    ``model`` is used live (no copy): hold :meth:`paused` while changing its weights so no batch sees a half
    updated model.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_size: int = 32,
        batch_wait_s: float = 0.005,
        max_model_len: int | None = None,
        prefix_sharing: bool = True,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"GenerationEngine(max_batch_size={max_batch_size}): must be >= 1")
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.max_model_len = max_model_len or getattr(model.config, "max_position_embeddings", 4096)
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.eos_token_ids = _eos_ids(model, tokenizer)
        self.prefix_sharing = prefix_sharing
        self._queue: queue.Queue[_Row | None] = queue.Queue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.model_version: str | None = None  # set by the owner while holding paused()
        self.batches_run = 0
        self.rows_run = 0

    # -- lifecycle ----------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the decoding thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="agl-hf-generation", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the decoding thread; queued requests fail with RuntimeError."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=30)
            self._thread = None
        while not self._queue.empty():
            row = self._queue.get_nowait()
            if row is not None and not row.future.done():
                row.future.set_exception(RuntimeError("generation engine stopped"))

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Block generation while the caller changes the model (e.g. an optimizer step)."""
        with self._lock:
            yield

    # -- requests -------------------------------------------------------------------------------------------------

    def submit(self, prompt_ids: list[int], params: SamplingParams) -> concurrent.futures.Future[Sample]:
        """Queue one completion of ``prompt_ids``; the future resolves to a :class:`Sample`."""
        if not prompt_ids:
            raise ValueError("empty prompt: at least one prompt token is needed")
        if len(prompt_ids) >= self.max_model_len:
            raise ValueError(
                f"prompt of {len(prompt_ids)} tokens does not fit the model's context of {self.max_model_len}"
            )
        if self._thread is None:
            raise RuntimeError("GenerationEngine.start() was not called")
        future: concurrent.futures.Future[Sample] = concurrent.futures.Future()
        self._queue.put(_Row(list(prompt_ids), params, future))
        return future

    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            rows = [first]
            deadline = time.monotonic() + self.batch_wait_s
            stop = False
            while len(rows) < self.max_batch_size:
                timeout = deadline - time.monotonic()
                try:
                    row = self._queue.get(timeout=max(timeout, 0)) if timeout > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if row is None:
                    stop = True
                    break
                rows.append(row)
            rows = [row for row in rows if row.future.set_running_or_notify_cancel()]
            if rows:
                try:
                    with self._lock:
                        samples = self._generate(rows)
                        for sample in samples:
                            sample.model_version = self.model_version
                except Exception as exc:  # noqa: BLE001 - a failed batch fails its requests, not the server
                    logger.exception("generation batch of %d rows failed", len(rows))
                    for row in rows:
                        row.future.set_exception(exc)
                else:
                    for row, sample in zip(rows, samples, strict=True):
                        row.future.set_result(sample)
            if stop:
                return

    # -- decoding -------------------------------------------------------------------------------------------------

    @torch.no_grad()
    def _generate(self, rows: list[_Row]) -> list[Sample]:
        self.batches_run += 1
        self.rows_run += len(rows)
        device = next(self.model.parameters()).device
        batch = len(rows)
        shared = _shared_prefix([row.prompt_ids for row in rows]) if self.prefix_sharing else 0
        width = max(len(row.prompt_ids) for row in rows) - shared
        input_ids = torch.full((batch, width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((batch, width), dtype=torch.long)
        for i, row in enumerate(rows):
            suffix = row.prompt_ids[shared:]
            input_ids[i, width - len(suffix) :] = torch.tensor(suffix)
            attention[i, width - len(suffix) :] = 1
        input_ids, attention = input_ids.to(device), attention.to(device)
        budgets = [max(1, min(row.params.max_tokens, self.max_model_len - len(row.prompt_ids))) for row in rows]
        temperatures = torch.tensor([max(row.params.temperature, 0.0) for row in rows], device=device)
        generators = [_generator(row.params.seed, device) for row in rows]

        was_training = self.model.training
        self.model.eval()
        try:
            cache = None
            if shared:
                # The rows' common prompt prefix (system prompt, tools, examples) is computed once and its KV
                # cache repeated for every row; rows then continue with [padding][own suffix], padding masked.
                prefix = torch.tensor([rows[0].prompt_ids[:shared]], device=device)
                cache = self.model(input_ids=prefix, use_cache=True, logits_to_keep=1).past_key_values
                cache.batch_repeat_interleave(batch)
                attention = torch.cat([torch.ones((batch, shared), dtype=attention.dtype, device=device), attention], 1)
            positions = ((attention.cumsum(-1) - 1).clamp(min=0))[:, shared:]
            out = self.model(
                input_ids=input_ids, attention_mask=attention, position_ids=positions, past_key_values=cache,
                use_cache=True, logits_to_keep=1,
            )
            tokens: list[list[int]] = [[] for _ in rows]
            logprobs: list[list[float]] = [[] for _ in rows]
            finish: list[str | None] = [None] * batch
            for _step in range(max(budgets)):
                logits = out.logits[:, -1, :].float()
                chosen, chosen_logprobs = self._sample(logits, temperatures, rows, generators)
                for i in range(batch):
                    if finish[i] is not None:
                        continue
                    token = int(chosen[i])
                    tokens[i].append(token)
                    logprobs[i].append(float(chosen_logprobs[i]))
                    if token in self.eos_token_ids or self._hit_stop(rows[i], tokens[i]):
                        finish[i] = "stop"
                    elif len(tokens[i]) >= budgets[i]:
                        finish[i] = "length"
                if all(reason is not None for reason in finish):
                    break
                next_ids = torch.tensor(
                    [tokens[i][-1] if finish[i] is None else self.pad_token_id for i in range(batch)], device=device
                ).unsqueeze(1)
                attention = torch.cat([attention, torch.ones((batch, 1), dtype=attention.dtype, device=device)], 1)
                positions = positions[:, -1:] + 1
                out = self.model(
                    input_ids=next_ids,
                    attention_mask=attention,
                    position_ids=positions,
                    past_key_values=out.past_key_values,
                    use_cache=True,
                )
        finally:
            if was_training:
                self.model.train()
        return [
            Sample(
                token_ids=tokens[i],
                logprobs=logprobs[i],
                text=self._text(rows[i], tokens[i]),
                finish_reason=finish[i] or "length",
            )
            for i in range(batch)
        ]

    def _sample(
        self,
        logits: torch.Tensor,
        temperatures: torch.Tensor,
        rows: list[_Row],
        generators: list[torch.Generator | None],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        greedy = temperatures <= 0
        scaled = logits / torch.where(greedy, torch.ones_like(temperatures), temperatures).unsqueeze(1)
        log_probs = torch.log_softmax(scaled, dim=-1)
        chosen = torch.empty(len(rows), dtype=torch.long, device=logits.device)
        for i, row in enumerate(rows):
            if bool(greedy[i]):
                chosen[i] = int(torch.argmax(log_probs[i]))
                continue
            filtered = _filter(log_probs[i], row.params.top_p, row.params.top_k)
            probs = torch.softmax(filtered, dim=-1)
            chosen[i] = int(torch.multinomial(probs, 1, generator=generators[i]))
        return chosen, log_probs.gather(1, chosen.unsqueeze(1)).squeeze(1)

    def _hit_stop(self, row: _Row, tokens: list[int]) -> bool:
        if not row.params.stop:
            return False
        text = self.tokenizer.decode(tokens[-16:], skip_special_tokens=True)
        return any(stop in text for stop in row.params.stop)

    def _text(self, row: _Row, tokens: list[int]) -> str:
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        for stop in row.params.stop:
            index = text.find(stop)
            if index >= 0:
                text = text[:index]
        return text


def _shared_prefix(prompts: list[list[int]], minimum: int = 32) -> int:
    """Length of the prompts' common prefix worth computing once (0 when shorter than ``minimum`` tokens); at least
    one token of every prompt is left to run per row."""
    first = prompts[0]
    length = min(len(prompt) for prompt in prompts) - 1
    for prompt in prompts[1:]:
        same = 0
        while same < length and prompt[same] == first[same]:
            same += 1
        length = same
    return length if length >= minimum else 0


def _filter(log_probs: torch.Tensor, top_p: float, top_k: int) -> torch.Tensor:
    """Mask tokens outside top-k and outside the top-p nucleus with -inf."""
    result = log_probs
    if top_k and 0 < top_k < result.numel():
        threshold = torch.topk(result, top_k).values[-1]
        result = result.masked_fill(result < threshold, float("-inf"))
    if 0 < top_p < 1:
        sorted_lp, order = torch.sort(result, descending=True)
        cumulative = torch.cumsum(torch.softmax(sorted_lp, dim=-1), dim=-1)
        remove = cumulative - torch.softmax(sorted_lp, dim=-1) > top_p
        result = result.clone()
        result[order[remove]] = float("-inf")
    return result


def _generator(seed: int | None, device: torch.device) -> torch.Generator | None:
    if seed is None:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(int(seed))
    return generator


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids
