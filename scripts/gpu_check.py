"""The prepared GPU check: generation tokens/s and one update's time on the HF backend, against the GPU's limits.

Runs where a GPU machine has torch and transformers (peft and vllm are used when present; with torch alone it
measures the device and says what else it needs) but no trl, no network
and not this package: the model is built from a config with random weights (speed does not depend on the values),
the prompts are random token ids, and the HF backend's batched decoder (``trainers/backends/hf/generation.py``, with
the ``attention.py`` it imports) is loaded from the repository's files when ``agentlightning`` is not installed.
Measured, in bf16:

- generation through :class:`GenerationEngine` (what ``HFBackendServer`` runs) at several batch sizes, as
  tokens/s and as a share of the decode limit (weights read once per step from HBM) and of peak compute;
- one update: forward + backward + AdamW step on ``--update-rows`` x ``--update-len`` tokens (fp32 master weights
  under bf16 autocast, as TRL's ``bf16=True``), full and LoRA (peft), as time and model-FLOPs utilisation; plus the
  no-grad forward the importance-sampling correction adds;
- vLLM's offline engine on the same random model, when ``import vllm`` works.

    python scripts/gpu_check.py                       # Qwen2.5-1.5B shape on cuda (time on an H200 not measured)
    python scripts/gpu_check.py --size tiny --device cpu --dtype float32   # a dry run anywhere

Each phase (a generation batch size, an update, a logprob forward, vLLM's engine start, a vLLM batch size) runs only
if its estimate fits in what is left of ``--budget-s`` (default 480: one 10-minute call on a lent machine, start-up
included); otherwise it is reported as ``{"skipped": "budget: X s left, needs ~Y s"}``. The estimate is the time a
comparable phase took, scaled (by the batch ratio, say) and times ``MARGIN``, or, before any has run, a fixed
``RESERVE_S``. Prints one line per measurement and, with ``--json PATH``, writes them all, rewriting the file after
each one; the last, ``total``, has ``elapsed_s`` and ``budget_s``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

SIZES = {  # Qwen2 shapes; "tiny" is for a dry run on CPU
    "tiny": dict(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=4096,
    ),
    "0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
    ),
    "1.5b": dict(
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
    ),
    "7b": dict(
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
    ),
}
PEAKS = {  # dense bf16 FLOP/s and HBM bytes/s from the vendors' data sheets (SXM parts)
    "H200": (989e12, 4.8e12),
    "H100": (989e12, 3.35e12),
    "A100": (312e12, 2.0e12),
    "L40S": (362e12, 0.864e12),
}


class _Ids:
    """Stands in for a tokenizer: the decoder needs pad/eos ids and a decode (no stop strings are used)."""

    pad_token_id = 0
    eos_token_id = None

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return ""


def _generation_module() -> Any:
    """The HF backend's ``generation`` module: from the installed package, else from this repository's files."""
    try:
        from agentlightning.trainers.backends.hf import generation
    except ImportError:
        pass
    else:
        return generation
    # generation.py imports attention.py under its package name: that one module is registered, not the package.
    _load_by_path("agentlightning.trainers.backends.hf.attention", "attention.py")
    return _load_by_path("agl_generation", "generation.py")


def _load_by_path(name: str, filename: str) -> Any:
    path = Path(__file__).resolve().parents[1] / "trainers" / "backends" / "hf" / filename
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peaks(device: torch.device, dtype: torch.dtype) -> tuple[str, float | None, float | None, float]:
    """(device name, data-sheet FLOP/s, data-sheet bytes/s, measured matmul FLOP/s)."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    sheet = next((value for key, value in PEAKS.items() if key in name), (None, None))
    n = 8192 if device.type == "cuda" else 1024
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    _sync(device)
    started, repeats = time.perf_counter(), 20 if device.type == "cuda" else 5
    for _ in range(repeats):
        a @ b
    _sync(device)
    return name, sheet[0], sheet[1], 2 * n**3 * repeats / (time.perf_counter() - started)


Report = Callable[..., None]

MARGIN = 1.5  # an estimate scaled from a phase that ran is this many times the scaled time
RESERVE_S = {  # what a phase of each kind needs before one like it has run: ample for 1.5B on one H200
    "generate": 60.0,  # the decoder's first batch, warm-up included
    "update": 120.0,  # two forward + backward + AdamW steps, the first building kernels and optimizer state
    "vllm": 240.0,  # importing vllm and starting its engine: save, load, torch.compile, CUDA-graph capture
}
# LoRA's backward skips the base weights' gradients but adds the adapters' small kernels, which dominate a small model:
# 5x the full update's time on the tiny CPU dry run; at 1.5B on a GPU compute dominates and it should be under 1x.
LORA_VS_FULL = 2.0
LOGPROB_VS_UPDATE = 0.5  # two no-grad forwards against two forward + backward + optimizer steps (about 1/3)


class Budget:
    """The seconds of ``--budget-s`` left, and how long each phase that ran took (wall clock, warm-up included)."""

    def __init__(self, seconds: float, report: Report, started: float, reserves: dict[str, float] = RESERVE_S) -> None:
        self.seconds, self.report, self.started, self.reserves = seconds, report, started, reserves
        self.took: dict[str, float] = {}

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def needs(self, kind: str, like: str | None = None, scale: float = 1.0) -> float:
        """MARGIN x scale x what phase ``like`` took if it ran, else the fixed reserve for phases of this kind
        (``reserves``: :data:`RESERVE_S` unless another script's phases are timed)."""
        if like in self.took:
            return MARGIN * scale * self.took[like]
        return self.reserves[kind]

    def allows(self, label: str, needs: float) -> bool:
        """Whether ``needs`` seconds are left; if not, ``label`` is reported as skipped."""
        left = self.seconds - self.elapsed()
        if needs <= left:
            return True
        self.report(label, skipped=f"budget: {left:.0f} s left, needs ~{needs:.0f} s")
        return False

    def run(self, label: str, needs: float, measure: Callable[[], None]) -> bool:
        """Runs ``measure`` (which reports ``label``) and times it if ``needs`` seconds are left; whether it ran."""
        if not self.allows(label, needs):
            return False
        started = time.perf_counter()
        measure()
        self.took[label] = time.perf_counter() - started
        return True


def _generation(model: Any, generation: Any, args: argparse.Namespace, budget: Budget) -> None:
    """Each batch size's estimate scales the last one timed by the batch ratio: decode time grows at most as much."""
    engine = generation.GenerationEngine(model, _Ids(), max_batch_size=max(args.batch), prefix_sharing=False)
    engine.eos_token_ids = set()  # every row decodes exactly max_tokens
    engine.start()
    try:
        timed = 0  # the batch size of the last phase that ran; none yet
        for batch in [1, *args.batch]:  # the first batch of one is the warm-up
            needs = budget.needs("generate", f"generate/batch{timed}", batch / max(timed, 1))
            measure = partial(_generate, engine, generation.SamplingParams, model, args, batch, budget.report)
            if budget.run(f"generate/batch{batch}", needs, measure):
                timed = batch
    finally:
        engine.stop()


def _generate(engine: Any, params_cls: Any, model: Any, args: argparse.Namespace, batch: int, report: Report) -> None:
    device = next(model.parameters()).device
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    prompts = torch.randint(1, model.config.vocab_size, (batch, args.prompt_len)).tolist()
    params = params_cls(max_tokens=args.new_tokens, temperature=1.0)
    _sync(device)
    started = time.perf_counter()
    samples = [f.result() for f in [engine.submit(p, params) for p in prompts]]
    seconds = time.perf_counter() - started
    tokens = sum(len(s.token_ids) for s in samples)
    steps_per_s = args.new_tokens / seconds
    report(
        f"generate/batch{batch}",
        tokens_per_s=tokens / seconds,
        seconds=seconds,
        tokens=tokens,
        decode_bandwidth_share=steps_per_s * weight_bytes / args.bandwidth if args.bandwidth else None,
        compute_share=2 * args.params * tokens / seconds / args.flops,
    )


def _updates(model: Any, args: argparse.Namespace, budget: Budget) -> Any:
    """Full, then LoRA when peft imports, each with its logprob forward; returns the model without adapters."""
    report = budget.report
    train_model = model.float().train()  # fp32 master weights; bf16 compute under autocast
    needs = budget.needs("update")
    budget.run("update/full", needs, partial(_update, train_model, args, report, "full", args.params))
    needs = budget.needs("update", "update/full", LOGPROB_VS_UPDATE)
    budget.run("logprob_forward/full", needs, partial(_logprob_forward, train_model, args, report, "full"))
    try:
        import peft
    except ImportError:
        report("update/lora", skipped="peft not importable")
        return train_model
    lora = peft.get_peft_model(
        train_model,
        peft.LoraConfig(
            r=16,
            lora_alpha=32,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        ),
    )
    trainable = sum(p.numel() for p in lora.parameters() if p.requires_grad)
    needs = budget.needs("update", "update/full", LORA_VS_FULL)
    budget.run("update/lora", needs, partial(_update, lora, args, report, "lora", trainable))
    needs = budget.needs("update", "update/lora", LOGPROB_VS_UPDATE)
    budget.run("logprob_forward/lora", needs, partial(_logprob_forward, lora, args, report, "lora"))
    return lora.unload()


def _autocast(device: torch.device, args: argparse.Namespace) -> Any:
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.dtype == "bfloat16")


def _update(model: Any, args: argparse.Namespace, report: Report, label: str, trainable: int) -> None:
    """Model FLOPs: 2P per token forward, 2P backward to activations, 2P to weights (full fine-tuning only)."""
    device = next(model.parameters()).device
    ids = torch.randint(1, model.config.vocab_size, (args.update_rows, args.update_len), device=device)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)
    tokens = ids.numel()
    for _ in range(2):  # the first builds kernels and optimizer state
        _sync(device)
        started = time.perf_counter()
        for row in range(0, args.update_rows, args.micro_batch):
            with _autocast(device, args):
                logits = model(ids[row : row + args.micro_batch]).logits[:, :-1].float()
                target = ids[row : row + args.micro_batch, 1:]
                loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1))
            loss.backward()
            del logits
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        _sync(device)
        seconds = time.perf_counter() - started
    report(
        f"update/{label}",
        seconds=seconds,
        tokens=tokens,
        trainable_params=trainable,
        mfu=(6 if label == "full" else 4) * args.params * tokens / seconds / args.flops,
    )


def _logprob_forward(model: Any, args: argparse.Namespace, report: Report, label: str) -> None:
    """The no-grad forward the importance-sampling correction adds, on the update's shape."""
    device = next(model.parameters()).device
    ids = torch.randint(1, model.config.vocab_size, (args.update_rows, args.update_len), device=device)
    with torch.no_grad(), _autocast(device, args):
        for _ in range(2):  # the second is timed
            _sync(device)
            started = time.perf_counter()
            for row in range(0, args.update_rows, args.micro_batch):
                model(ids[row : row + args.micro_batch]).logits.float().log_softmax(-1)
            _sync(device)
            seconds = time.perf_counter() - started
    report(
        f"logprob_forward/{label}",
        seconds=seconds,
        tokens=ids.numel(),
        mfu=2 * args.params * ids.numel() / seconds / args.flops,
    )


def _vllm(model: Any, args: argparse.Namespace, budget: Budget) -> None:
    """The engine's start, then each batch size, whose estimate is the HF backend's time for it (vLLM is faster)."""
    try:
        from vllm import LLM, SamplingParams
    except ImportError as exc:
        budget.report("vllm", skipped=f"vllm not importable ({exc.__class__.__name__})")
        return
    with tempfile.TemporaryDirectory() as directory:
        started = time.perf_counter()
        model.save_pretrained(directory)
        engine = LLM(
            model=directory,
            skip_tokenizer_init=True,
            dtype=args.dtype,
            gpu_memory_utilization=args.vllm_memory,
            max_model_len=args.prompt_len + args.new_tokens + 8,
        )
        budget.report("vllm", start_seconds=time.perf_counter() - started)
        params = SamplingParams(max_tokens=args.new_tokens, temperature=1.0, ignore_eos=True, detokenize=False)
        for batch in [1, *args.batch]:
            needs = budget.needs("generate", f"generate/batch{batch}")
            measure = partial(_vllm_generate, engine, params, model, args, batch, budget.report)
            budget.run(f"vllm/batch{batch}", needs, measure)
        del engine


def _vllm_generate(engine: Any, params: Any, model: Any, args: argparse.Namespace, batch: int, report: Report) -> None:
    prompts = [
        {"prompt_token_ids": row}
        for row in torch.randint(1, model.config.vocab_size, (batch, args.prompt_len)).tolist()
    ]
    started = time.perf_counter()
    outputs = engine.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - started
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    report(
        f"vllm/batch{batch}",
        tokens_per_s=tokens / seconds,
        seconds=seconds,
        tokens=tokens,
        compute_share=2 * args.params * tokens / seconds / args.flops,
    )


def _write_json(path: Path, results: list[dict[str, Any]]) -> None:
    """Rewrites the file whole through a rename: a run killed at any point leaves every measurement reported so far."""
    staged = path.with_name(path.name + ".part")
    staged.write_text(json.dumps(results, indent=1, default=str))
    staged.replace(path)


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="1.5b")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--update-rows", type=int, default=32)
    parser.add_argument("--update-len", type=int, default=1024)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--vllm-memory", type=float, default=0.4, help="vLLM's GPU memory share")
    parser.add_argument("--skip-vllm", action="store_true")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=480.0,
        help="skip each phase that would not end within this many seconds of the start (default: %(default)s, "
        "one 10-minute call with the machine's start-up)",
    )
    parser.add_argument("--json", help="write every measurement to this file (rewritten after each one)")
    args = parser.parse_args(argv)

    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    torch.manual_seed(0)
    results: list[dict[str, Any]] = []

    def report(label: str, **values: Any) -> None:
        results.append({"measurement": label, **values})
        shown = ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items() if v is not None
        )
        print(f"{label}: {shown}", flush=True)
        if args.json:
            _write_json(Path(args.json), results)

    budget = Budget(args.budget_s, report, started)
    name, sheet_flops, sheet_bytes, measured = _peaks(device, dtype)
    args.flops, args.bandwidth = sheet_flops or measured, sheet_bytes
    report(
        "device",
        name=name,
        torch=torch.__version__,
        dtype=args.dtype,
        datasheet_flops=sheet_flops,
        datasheet_bandwidth=sheet_bytes,
        measured_matmul_flops=measured,
    )
    try:
        from transformers import Qwen2Config, Qwen2ForCausalLM
    except ImportError as exc:  # torch alone still measures the device
        report("model", skipped=f"the model and the HF backend's decoder need transformers ({exc})")
        report("total", elapsed_s=budget.elapsed(), budget_s=args.budget_s)
        return 0
    config = Qwen2Config(**SIZES[args.size], max_position_embeddings=4096, tie_word_embeddings=args.size != "7b")
    model = Qwen2ForCausalLM(config).to(device=device, dtype=dtype).eval()
    args.params = sum(p.numel() for p in model.parameters())
    report("model", size=args.size, params=args.params)

    _generation(model, _generation_module(), args, budget)
    train_model = _updates(model, args, budget)
    if not args.skip_vllm and budget.allows("vllm", budget.needs("vllm")):  # asked before the import, itself slow
        train_model = train_model.to(device="cpu", dtype=dtype)  # leave the GPU to vLLM
        if device.type == "cuda":
            torch.cuda.empty_cache()
        _vllm(train_model, args, budget)
    report("total", elapsed_s=budget.elapsed(), budget_s=args.budget_s)
    return 0 if all(math.isfinite(r.get("seconds", 0.0)) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
