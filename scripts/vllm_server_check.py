"""The prepared vLLM-server GPU check: tokens/s through the Lightning proxy against plain vLLM, and weight-sync time.

Runs where torch, transformers, peft and vllm are installed and this package is importable (installed, or from this
repository's files: the root goes on ``sys.path`` and ``trainers/`` becomes ``agentlightning.trainers``, as
pyproject's package-dir maps it). No downloads: a Qwen2 model of ``--size`` is built from its config with random
weights (speed does not depend on the values) and saved with the trainer's tiny tokenizer. Measured:

- the same ``--requests`` chat requests (``--max-tokens`` each, end-of-sequence ignored, temperature 0,
  ``--concurrency`` at a time, with the token ids and logprobs a training run asks for) sent once straight to a
  :class:`VLLMBackend` server and once through a :class:`LightningServer`'s proxy, each request on its own rollout's
  proxy URL as an agent sends it: completion tokens/s of each and their ratio (before each pass, ``--concurrency``
  warm-up requests and a prefix-cache reset; the requests name the base model, not an adapter);
- ``--syncs`` weight syncs (``backend.updating(version)``) of a LoRA policy (PEFT, rank 16, every linear layer) with
  ``sync="lora"`` on that server, then of the full model with ``sync="disk"`` on a second server: seconds each.

    python scripts/vllm_server_check.py --json out.json     # Qwen2.5-0.5B shape on cuda (not run on a GPU yet)
    python scripts/vllm_server_check.py --size tiny --requests 4 --max-tokens 8   # a dry run on vLLM's CPU build

``--budget-s`` (default 480) is kept as in ``scripts/gpu_check.py``, whose :class:`Budget` this uses: each phase
(a server's start, each throughput pass, each mode's syncs) runs only if its estimate fits in what is left, else it
is reported as ``{"skipped": "budget: X s left, needs ~Y s"}``; the phases on a server that was not started are
reported skipped for that reason. Prints one line per measurement and, with ``--json PATH``, rewrites the file after
each; the last row, ``total``, has ``elapsed_s`` and ``budget_s``.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, Literal

import httpx
import torch

ROOT = Path(__file__).resolve().parents[1]
RESERVE_S = {  # what a phase needs before one like it has run: ample for 0.5B on one H200
    "start": 240.0,  # vLLM's server start: load, torch.compile, CUDA-graph capture
    "requests": 60.0,  # the first throughput pass
    "syncs": 60.0,  # the first mode's syncs
}
PROXY_VS_DIRECT = 2.0  # the proxied pass is estimated as the direct one's time scaled by this
DISK_VS_LORA = 10.0  # full weights saved and reloaded against a rank-16 adapter: 56x the parameters at 0.5B, 8x the
# seconds on the tiny CPU dry run
LORA_RANK = 16
MAX_MODEL_LEN = 2048
WORKER = "vllm-server-check"


def _load_gpu_check() -> Any:
    """``scripts/gpu_check.py`` as a module: its model shapes, :class:`Budget` and JSON writer."""
    spec = importlib.util.spec_from_file_location("agl_gpu_check", Path(__file__).with_name("gpu_check.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _import_package() -> None:
    """Make ``agentlightning`` importable: the installed package, else this repository's files."""
    if importlib.util.find_spec("agentlightning") is not None:
        return
    sys.path.insert(0, str(ROOT))
    trainers = ROOT / "trainers"
    spec = importlib.util.spec_from_file_location(
        "agentlightning.trainers", trainers / "__init__.py", submodule_search_locations=[str(trainers)]
    )
    assert spec is not None and spec.loader is not None
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


def _save_model(gpu_check: Any, args: argparse.Namespace, directory: Path) -> Any:
    """The random Qwen2 model of ``--size``, saved to ``directory`` with the tiny tokenizer; returns the model."""
    from agentlightning.trainers.models import tiny_tokenizer
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = tiny_tokenizer()
    config = Qwen2Config(
        **gpu_check.SIZES[args.size],
        max_position_embeddings=MAX_MODEL_LEN,
        tie_word_embeddings=args.size != "7b",
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(dtype=getattr(torch, args.dtype))
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return model.to(args.device).eval()


def _lora(model: Any) -> Any:
    import peft

    modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    return peft.get_peft_model(model, peft.LoraConfig(r=LORA_RANK, lora_alpha=2 * LORA_RANK, target_modules=modules))


def _backend(directory: Path, policy: Any, sync: Literal["lora", "disk"], args: argparse.Namespace) -> Any:
    from agentlightning.trainers.backends.vllm.server import VLLMBackend

    return VLLMBackend(
        directory,
        policy=policy,
        sync=sync,
        python=args.vllm_python,
        dtype=args.dtype,
        gpu_memory_utilization=args.vllm_memory,
        max_model_len=MAX_MODEL_LEN,
        env={} if torch.cuda.is_available() else {"VLLM_CPU_KVCACHE_SPACE": "1"},
        startup_timeout=600,
    )


@contextmanager
def _served(label: str, make: Callable[[], Any], budget: Any) -> Iterator[Any]:
    """The started backend ``make()`` builds (None when its start did not fit), stopped on leaving."""
    backend: list[Any] = []

    def start() -> None:
        started = time.perf_counter()
        backend.append(make().start())
        budget.report(label, seconds=time.perf_counter() - started)

    needs = budget.needs("start", "start/lora")
    try:
        budget.run(label, needs, start)
        yield backend[0] if backend else None
    finally:
        if backend:
            backend[0].stop()


def _body(backend: Any, args: argparse.Namespace, index: int) -> dict[str, Any]:
    """Request ``index``, with the fields the proxy adds for a training run (it sets ``model`` itself)."""
    return {
        "model": backend.model_name,
        "messages": [{"role": "user", "content": f"Request {index}: count from 1 to 100."}],
        "max_tokens": args.max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,  # every answer is max_tokens long
        "return_token_ids": True,
        "logprobs": True,
    }


def _completion_tokens(http: httpx.Client, url: str, body: dict[str, Any]) -> int:
    response = http.post(f"{url}/chat/completions", json=body)
    response.raise_for_status()
    return int(response.json()["usage"]["completion_tokens"])


def _requests(backend: Any, urls: list[str], args: argparse.Namespace, report: Callable[..., None], label: str) -> None:
    """``--concurrency`` warm-up requests at once, a prefix-cache reset, then the ``--requests`` timed ones,
    ``--concurrency`` at a time: request i to ``urls[i]``, of which there are as many."""
    warm_up, timed = urls[: args.concurrency], urls[args.concurrency :]
    bodies = [_body(backend, args, index) for index in range(-len(warm_up), len(timed))]
    with httpx.Client(timeout=600) as http, ThreadPoolExecutor(args.concurrency) as pool:
        send = partial(_completion_tokens, http)
        list(pool.map(send, warm_up, bodies[: len(warm_up)]))
        http.post(f"{backend.url}/reset_prefix_cache").raise_for_status()
        started = time.perf_counter()
        tokens = sum(pool.map(send, timed, bodies[len(warm_up) :]))
        seconds = time.perf_counter() - started
    report(label, tokens_per_s=tokens / seconds, seconds=seconds, tokens=tokens, requests=args.requests)


@contextmanager
def _proxy_urls(backend: Any, store: Path, count: int) -> Iterator[list[str]]:
    """A Lightning server in front of ``backend`` as a training run sets it up, and ``count`` leased rollouts'
    proxy URLs."""
    from agentlightning.protocol import proxy_path
    from agentlightning.server import LightningServer

    with LightningServer(store) as server:
        server.set_upstream(
            backend.base_url,
            backend.model_name,
            backend.model_version,
            logprobs=True,
            sampling_overrides=backend.sampling_overrides,
            translate_responses=True,
        )
        server.enqueue([{"index": index} for index in range(count)])
        urls = []
        for _ in range(count):
            lease = server.store.dequeue(WORKER, 3600.0)  # an hour: no heartbeat is sent
            assert lease is not None, "each rollout just queued is leased"
            urls.append(f"{server.url}{proxy_path(lease.rollout_id, lease.attempt)}")
        yield urls


def _throughput(backend: Any, directory: Path, args: argparse.Namespace, budget: Any) -> None:
    """Direct, then through the proxy (estimated from the direct pass)."""
    count = args.concurrency + args.requests
    direct = [backend.base_url] * count
    measure = partial(_requests, backend, direct, args, budget.report, "requests/direct")
    budget.run("requests/direct", budget.needs("requests"), measure)
    needs = budget.needs("requests", "requests/direct", PROXY_VS_DIRECT)
    with _proxy_urls(backend, directory / "store.db", count) as proxied:
        measure = partial(_requests, backend, proxied, args, budget.report, "requests/proxy")
        budget.run("requests/proxy", needs, measure)


def _ratio(rows: list[dict[str, Any]], report: Callable[..., None]) -> None:
    """Proxied tokens/s over direct tokens/s, when both passes ran."""
    rates = {row["measurement"]: row.get("tokens_per_s") for row in rows}
    if rates.get("requests/direct") and rates.get("requests/proxy"):
        report("requests/ratio", proxy_vs_direct=rates["requests/proxy"] / rates["requests/direct"])


def _syncs(backend: Any, args: argparse.Namespace, report: Callable[..., None], label: str) -> None:
    """``--syncs`` syncs of unchanged weights: what a sync costs does not depend on their values."""
    seconds = []
    for version in range(1, args.syncs + 1):
        started = time.perf_counter()
        with backend.updating(f"v{version}"):
            pass
        seconds.append(time.perf_counter() - started)
    report(label, seconds=sum(seconds) / len(seconds), each_s=seconds, served=backend.model_name)


def _skip_unserved(budget: Any, labels: list[str], server: str) -> None:
    for label in labels:
        budget.report(label, skipped=f"no server: {server} did not start")


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    gpu_check = _load_gpu_check()
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=sorted(gpu_check.SIZES), default="0.5b")
    parser.add_argument("--device", default="cuda" if cuda else "cpu", help="where the trainer's policy lives")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16" if cuda else "float32")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--syncs", type=int, default=3, help="syncs timed per mode")
    parser.add_argument("--vllm-memory", type=float, default=0.5, help="vLLM's GPU memory share")
    parser.add_argument("--vllm-python", help="the interpreter that runs vLLM (default: .venv-vllm, else this one)")
    parser.add_argument(
        "--budget-s", type=float, default=480.0, help="as scripts/gpu_check.py's (default: %(default)s)"
    )
    parser.add_argument("--json", help="write every measurement to this file (rewritten after each one)")
    args = parser.parse_args(argv)
    _import_package()

    rows: list[dict[str, Any]] = []

    def report(label: str, **values: Any) -> None:
        rows.append({"measurement": label, **values})
        print(f"{label}: {values}", flush=True)
        if args.json:
            gpu_check._write_json(Path(args.json), rows)

    budget = gpu_check.Budget(args.budget_s, report, started, reserves=RESERVE_S)
    with tempfile.TemporaryDirectory(prefix="agl-vllm-check-") as temporary:
        directory = Path(temporary)
        built = time.perf_counter()
        model = _save_model(gpu_check, args, directory / "model")
        params = sum(p.numel() for p in model.parameters())
        seconds = time.perf_counter() - built
        report("model", size=args.size, params=params, dtype=args.dtype, device=args.device, seconds=seconds)
        policy = _lora(model)
        with _served("start/lora", partial(_backend, directory / "model", policy, "lora", args), budget) as backend:
            if backend is None:
                _skip_unserved(budget, ["requests/direct", "requests/proxy", "sync/lora"], "start/lora")
            else:
                _throughput(backend, directory, args, budget)
                _ratio(rows, report)
                budget.run("sync/lora", budget.needs("syncs"), partial(_syncs, backend, args, report, "sync/lora"))
        full = policy.unload()
        with _served("start/disk", partial(_backend, directory / "model", full, "disk", args), budget) as backend:
            if backend is None:
                _skip_unserved(budget, ["sync/disk"], "start/disk")
            else:
                needs = budget.needs("syncs", "sync/lora", DISK_VS_LORA)
                budget.run("sync/disk", needs, partial(_syncs, backend, args, report, "sync/disk"))
    report("total", elapsed_s=budget.elapsed(), budget_s=args.budget_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
