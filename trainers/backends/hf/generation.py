"""Batched sampling for the in-process Hugging Face backend: exact token ids and per-token log-probabilities.

Concurrent requests are queued and decoded together with a KV cache, continuously: rows that arrive while a batch
is decoding join it at the next step (their prompts prefilled together), and finished rows leave it at once (their
requests are answered then), so the batch stays full while requests keep coming. Each row has its own
temperature, top-p, top-k, seed, stop strings and token budget. The prompt prefix that the rows share (system
prompt, tools, examples) is computed once per model version and its KV cache reused by every row that starts with
it. Log-probabilities are those of the sampling distribution (logits divided by the temperature, before
top-p/top-k), which is what TRL's loss computes for the same tokens. A row is decoded from start to end by one
model version: :meth:`GenerationEngine.paused` lets the running rows finish and admits no new ones until the
weights have changed. With several LoRA adapters on one PEFT model (``multi_adapter``, one per policy), each row
names its adapter (None: the base model) and rows of different adapters decode in the same batch (PEFT's
mixed-adapter forward, ``adapter_names=``); the shared prefix is cached per adapter.
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
from agentlightning.trainers.backends.hf.attention import use_shared_kv_attention

logger = logging.getLogger(__name__)

BASE = "__base__"
"""PEFT's ``adapter_names`` entry for a row served by the base model (no adapter)."""
_DROPOUTS = (
    torch.nn.Dropout,
    torch.nn.Dropout1d,
    torch.nn.Dropout2d,
    torch.nn.Dropout3d,
    torch.nn.AlphaDropout,
    torch.nn.FeatureAlphaDropout,
)


def training_mode_matters(model: Any) -> bool:
    """Whether ``model`` computes differently in training mode: a dropout with p > 0 (a module, such as a LoRA
    adapter's, or the attention rate of its config) or gradient checkpointing (which turns the KV cache off)."""
    if (getattr(getattr(model, "config", None), "attention_dropout", 0.0) or 0.0) > 0:
        return True
    for module in model.modules():
        if (isinstance(module, _DROPOUTS) and module.p > 0) or getattr(module, "gradient_checkpointing", False) is True:
            return True
    return False


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
    adapter: str | None = None  # the LoRA adapter that generated it (multi_adapter engines)


@dataclass
class _Row:
    prompt_ids: list[int]
    params: SamplingParams
    future: concurrent.futures.Future[Sample]
    adapter: str | None = None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    budget: int = 0
    generator: torch.Generator | None = None
    finish: str | None = None


@dataclass
class _Batch:
    """The rows being decoded, their KV cache and attention mask (one column per cached position, 0 = padding)."""

    rows: list[_Row]
    cache: Any
    attention: torch.Tensor
    positions: torch.Tensor  # [rows, 1]: position id of each row's last sampled token


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
        use_shared_kv_attention(model)  # on CPU: grouped KV heads read in place, not copied (the same numbers)
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        if max_model_len is None:
            max_model_len = getattr(model.config, "max_position_embeddings", 4096)
        self.max_model_len: int = max_model_len
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.eos_token_ids = _eos_ids(model, tokenizer)
        self.prefix_sharing = prefix_sharing
        self._queue: queue.Queue[_Row | None] = queue.Queue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pausing = 0  # paused() callers waiting for the running rows to finish
        self._pausing_lock = threading.Lock()
        self._prefix_ids: list[int] = []  # the last shared prompt prefix, and its KV per adapter for one model version
        self._prefix_kv: dict[str | None, tuple[str | None, list[tuple[torch.Tensor, torch.Tensor]]]] = {}
        self.model_version: str | None = None  # set by the owner while holding paused()
        self.multi_adapter = False  # rows name their LoRA adapter (set by the owner before start)
        self.versions: dict[str | None, str] = {}  # per adapter (multi_adapter), set by the owner holding paused()
        self.batches_run = 0  # prefill passes (groups of rows admitted together)
        self.rows_run = 0
        self.rows_joined = 0  # rows admitted into a batch that was already decoding
        self._decodes_in_eval: bool | None = None

    @property
    def decodes_in_eval(self) -> bool:
        """Whether each decode step switches the model to eval mode (and back): for a model whose training mode
        computes differently (:func:`training_mode_matters`) and for PEFT's mixed-adapter forward (``multi_adapter``),
        which refuses training mode. Any other model is decoded in the mode it is in, so that a trainer's update
        running beside the decoder (``max_staleness > 0``) never sees the mode switched under it (TRL's loss reads
        it). Looked at once, when first asked (by the first step at the latest)."""
        if self._decodes_in_eval is None:
            self._decodes_in_eval = self.multi_adapter or training_mode_matters(self.model)
        return self._decodes_in_eval

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
        """Block generation while the caller changes the model (e.g. an optimizer step): rows being decoded finish
        on the current weights first, queued ones wait."""
        with self._pausing_lock:
            self._pausing += 1
        try:
            with self._lock:
                yield
        finally:
            with self._pausing_lock:
                self._pausing -= 1

    # -- requests -------------------------------------------------------------------------------------------------

    def submit(
        self, prompt_ids: list[int], params: SamplingParams, adapter: str | None = None
    ) -> concurrent.futures.Future[Sample]:
        """Queue one completion of ``prompt_ids`` (by LoRA ``adapter``, None: the base model, on a ``multi_adapter``
        engine); the future resolves to a :class:`Sample`."""
        if not prompt_ids:
            raise ValueError("empty prompt: at least one prompt token is needed")
        if len(prompt_ids) >= self.max_model_len:
            raise ValueError(
                f"prompt of {len(prompt_ids)} tokens does not fit the model's context of {self.max_model_len}"
            )
        if self._thread is None:
            raise RuntimeError("GenerationEngine.start() was not called")
        future: concurrent.futures.Future[Sample] = concurrent.futures.Future()
        self._queue.put(_Row(list(prompt_ids), params, future, adapter))
        return future

    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            rows, stop = self._collect([first], self.batch_wait_s)
            with self._lock:
                batch: _Batch | None = None
                while rows or batch is not None:
                    rows = [row for row in rows if row.future.set_running_or_notify_cancel()]
                    try:
                        batch = self._step(batch, rows)
                    except Exception as exc:  # noqa: BLE001 - a failed batch fails its requests, not the server
                        failed = rows + (batch.rows if batch is not None else [])
                        logger.exception("generation of %d rows failed", len(failed))
                        for row in failed:
                            if not row.future.done():
                                row.future.set_exception(exc)
                        batch = None
                    rows = []
                    room = self.max_batch_size - (len(batch.rows) if batch is not None else 0)
                    if not stop and room > 0 and not self._pausing:
                        rows, stop = self._collect([], 0.0, room)
            if stop:
                return

    def _collect(self, rows: list[_Row], wait_s: float, room: int | None = None) -> tuple[list[_Row], bool]:
        """``rows`` plus what is queued (waiting up to ``wait_s`` for more), up to ``room`` rows; True when the
        stop sentinel was met."""
        room = self.max_batch_size if room is None else room
        deadline = time.monotonic() + wait_s
        while len(rows) < room:
            timeout = deadline - time.monotonic()
            try:
                row = self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if row is None:
                return rows, True
            rows.append(row)
        return rows, False

    # -- decoding -------------------------------------------------------------------------------------------------

    @torch.inference_mode()  # ~10% less CPU than no_grad() per decode step here
    def _step(self, batch: _Batch | None, new_rows: list[_Row]) -> _Batch | None:
        """Admit ``new_rows`` (prefill, first token) or, with none, decode one token for every row of ``batch``;
        answer the rows that finished and return what is left to decode."""
        switched = self.decodes_in_eval and self.model.training
        if switched:
            self.model.eval()
        try:
            if new_rows:
                admitted = self._prefill(new_rows)
                if batch is not None:
                    self.rows_joined += len(new_rows)
                    admitted = _merge(batch, admitted, self.model.config)
                batch = admitted
            elif batch is not None:
                device = batch.attention.device
                last = torch.tensor([[row.tokens[-1]] for row in batch.rows], device=device)
                batch.attention = torch.cat([batch.attention, batch.attention.new_ones((len(batch.rows), 1))], 1)
                batch.positions = batch.positions + 1
                out = self.model(
                    input_ids=last,
                    attention_mask=batch.attention,
                    position_ids=batch.positions,
                    past_key_values=batch.cache,
                    use_cache=True,
                    **self._adapters([row.adapter for row in batch.rows]),
                )
                batch.cache = out.past_key_values
                self._sample_into(batch.rows, out.logits[:, -1, :].float())
            else:
                return None
        finally:
            if switched:
                self.model.train()
        keep = [index for index, row in enumerate(batch.rows) if row.finish is None]
        for row in batch.rows:
            if row.finish is not None:
                version = self.versions.get(row.adapter, self.model_version) if self.multi_adapter else None
                row.future.set_result(
                    Sample(
                        row.tokens,
                        row.logprobs,
                        self._text(row, row.tokens),
                        row.finish,
                        version or self.model_version,
                        row.adapter,
                    )
                )
        if not keep:
            return None
        if len(keep) < len(batch.rows):
            index = torch.tensor(keep, device=batch.attention.device)
            batch.cache.batch_select_indices(index)
            batch.rows = [batch.rows[i] for i in keep]
            batch.attention, batch.positions = batch.attention[index], batch.positions[index]
        return batch

    def _prefill(self, rows: list[_Row]) -> _Batch:
        """Run the prompts of ``rows`` (the shared prefix from its cache) and sample each row's first token."""
        self.batches_run += 1
        self.rows_run += len(rows)
        device = next(self.model.parameters()).device
        for row in rows:
            row.budget = max(1, min(row.params.max_tokens, self.max_model_len - len(row.prompt_ids)))
            row.generator = _generator(row.params.seed, device)
        shared, prefix = self._prefix(rows, device)
        width = max(len(row.prompt_ids) for row in rows) - shared
        input_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(rows), shared + width), dtype=torch.long)
        attention[:, :shared] = 1
        for i, row in enumerate(rows):
            suffix = row.prompt_ids[shared:]
            input_ids[i, width - len(suffix) :] = torch.tensor(suffix)
            attention[i, shared + width - len(suffix) :] = 1
        input_ids, attention = input_ids.to(device), attention.to(device)
        # Rows continue the shared prefix's KV with [padding][own suffix], the padding masked.
        cache = None if prefix is None else _cache(prefix, self.model.config)
        positions = ((attention.cumsum(-1) - 1).clamp(min=0))[:, shared:]
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
            **self._adapters([row.adapter for row in rows]),
        )
        self._sample_into(rows, out.logits[:, -1, :].float())
        return _Batch(list(rows), out.past_key_values, attention, positions[:, -1:])

    def _prefix(self, rows: list[_Row], device: torch.device) -> tuple[int, Any]:
        """(length, per-layer KV for every row) of the prompt prefix these rows share: the remembered one when every
        row starts with it (recomputed once per model version and adapter), else the rows' own common prefix;
        (0, None) for none."""
        if not self.prefix_sharing:
            return 0, None
        prompts = [row.prompt_ids for row in rows]
        known = len(self._prefix_ids)
        if not (known and all(len(p) > known and p[:known] == self._prefix_ids for p in prompts)):
            known = _shared_prefix(prompts) if len(prompts) > 1 else 0
            if not known:
                return 0, None
            self._prefix_ids, self._prefix_kv = list(prompts[0][:known]), {}
        adapters = [row.adapter for row in rows]
        missing = list(
            dict.fromkeys(
                a for a in adapters if a not in self._prefix_kv or self._prefix_kv[a][0] != self.model_version
            )
        )
        if missing:
            ids = torch.tensor([self._prefix_ids] * len(missing), device=device)
            cache = self.model(
                input_ids=ids, use_cache=True, logits_to_keep=1, **self._adapters(missing)
            ).past_key_values
            for index, adapter in enumerate(missing):
                self._prefix_kv[adapter] = (
                    self.model_version,
                    [(layer.keys[index : index + 1], layer.values[index : index + 1]) for layer in cache.layers],
                )
        if len(set(adapters)) == 1:
            return known, [
                (k.expand(len(rows), -1, -1, -1), v.expand(len(rows), -1, -1, -1))
                for k, v in self._prefix_kv[adapters[0]][1]
            ]
        per_row = [self._prefix_kv[adapter][1] for adapter in adapters]
        return known, [
            tuple(torch.cat([layers[i][part] for layers in per_row]) for part in (0, 1)) for i in range(len(per_row[0]))
        ]

    def _adapters(self, adapters: list[str | None]) -> dict[str, Any]:
        """The forward's ``adapter_names`` (PEFT's mixed-adapter batch: one per row) on a ``multi_adapter`` engine."""
        if not self.multi_adapter:
            return {}
        return {"adapter_names": [adapter if adapter is not None else BASE for adapter in adapters]}

    def _sample_into(self, rows: list[_Row], logits: torch.Tensor) -> None:
        """Sample one token per row from ``logits`` [rows, vocab]; record it and whether the row is finished."""
        temperatures = torch.tensor([max(row.params.temperature, 0.0) for row in rows], device=logits.device)
        chosen, chosen_logprobs = self._sample(logits, temperatures, rows, [row.generator for row in rows])
        for row, token, logprob in zip(rows, chosen.tolist(), chosen_logprobs.tolist(), strict=True):
            row.tokens.append(token)
            row.logprobs.append(logprob)
            if token in self.eos_token_ids or self._hit_stop(row, row.tokens):
                row.finish = "stop"
            elif len(row.tokens) >= row.budget:
                row.finish = "length"

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
        chosen = log_probs.argmax(dim=-1)  # what greedy rows keep
        sampled = [i for i, row in enumerate(rows) if not bool(greedy[i])]
        # Rows without a seed, top-p or top-k draw together from the global generator, the others one by one.
        together = [
            i for i in sampled if generators[i] is None and rows[i].params.top_p >= 1 and not rows[i].params.top_k
        ]
        if together:
            chosen[together] = torch.multinomial(log_probs[together].exp(), 1).squeeze(1)
        for i in sampled:
            if i not in together:
                probs = torch.softmax(_filter(log_probs[i], rows[i].params.top_p, rows[i].params.top_k), dim=-1)
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


def _cache(layers: list[tuple[torch.Tensor, torch.Tensor]], config: Any) -> Any:
    from transformers import DynamicCache

    return DynamicCache(ddp_cache_data=layers, config=config)


def _merge(batch: _Batch, new: _Batch, config: Any) -> _Batch:
    """One batch of both: caches and masks left-padded (masked) to a common length, leading columns that are
    padding in every row dropped."""
    if any(getattr(layer, "is_sliding", False) for layer in batch.cache.layers):
        raise NotImplementedError("joining a running batch is not supported with sliding-window attention layers")
    parts = []
    for part in (batch, new):
        used = part.attention.amax(dim=0)  # 1 where some row attends
        skip = int(used.argmax())  # the first such column
        parts.append((part, skip, part.attention.size(1) - skip))
    length = max(width for _, _, width in parts)

    def padded(tensor: torch.Tensor, skip: int, width: int) -> torch.Tensor:
        dim = -2 if tensor.dim() == 4 else -1  # KV [rows, heads, positions, head_dim] or mask [rows, positions]
        tensor = tensor.narrow(dim, skip, width)
        if width == length:
            return tensor
        shape = list(tensor.shape)
        shape[dim] = length - width
        return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)

    layers = []
    for old_layer, new_layer in zip(batch.cache.layers, new.cache.layers, strict=True):
        layers.append(
            tuple(
                torch.cat(
                    [
                        padded(getattr(layer, name), skip, width)
                        for layer, (_, skip, width) in zip((old_layer, new_layer), parts, strict=True)
                    ]
                )
                for name in ("keys", "values")
            )
        )
    attention = torch.cat([padded(part.attention, skip, width) for part, skip, width in parts])
    return _Batch(batch.rows + new.rows, _cache(layers, config), attention, torch.cat([batch.positions, new.positions]))


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
