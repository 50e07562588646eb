"""Benchmark: one ``make demo`` step broken down by phase, each against its compute limit, before vs after.

The demo (``python -m examples.demo``, SmolLM2-135M, LoRA GRPO, in-process HF backend) runs ``--steps``
steps in a child process for each side, each with its own defaults (``--demo-args`` adds options to both):
``baseline`` is the code of ``--baseline`` (a git revision, default the commit this work started from, extracted
with ``git archive``; its demo is ``examples.demo``, or ``agentlightning.demo`` before 7ca1f29) and ``current`` is
this worktree; the sides alternate ``--repeats`` times so that both see the same machine load. Rollouts have no
timeout (a loaded machine must not turn slow rollouts into lost ones). Each child times, from the outside (forward
hooks on the policy model, PyTorch's global optimizer hooks, wrappers around the rollout pipeline's ``next_step``,
the rollout source's ``run`` and the generation engine's ``submit``):

- rollout prefill / decode: no-grad forwards of several tokens / of one token, during a training step's rollouts;
- rollout other: the rest of those rollouts (HTTP, the agents, capture, waiting for a batch);
- update forward / backward / optimizer / other: the TRL update (forward = the backbone's forwards; backward =
  from the gradient reaching the backbone's output to the next optimizer step or forward; other = the LM head and
  its backward, loss terms, micro-batch shaping, clipping);
- step other: the step's wall time outside its rollouts and update (transitions, advantages, packing);
- validation: one greedy pass over the held-out set (prefill, decode, other), reported per pass.

The compute limit of a phase is the matmul FLOPs it cannot avoid, at the fp32 matmul rate measured in the same
child (a 2048x2048 product): 2 x non-embedding parameters per token run through the model, plus 2 x hidden x vocab
per token whose logits are needed; the prompt prefix shared by a step's requests counts once; backward counts as
much as forward (LoRA: the frozen weights need activation gradients only); attention (~5% here) is left out.
Figures are seconds per training step (median over the steps after the first) and the ratio to the limit.

    python tests/benchmarks/bench_demo_step.py [--steps 3] [--repeats 1] [--baseline REV] [--demo-args '...']
    python -m pytest -q -s tests/benchmarks/bench_demo_step.py
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
BASELINE = "7ca1f29"  # the demo at examples/demo with 4 tasks x 4 rollouts a step
PHASES = [
    "rollout prefill",
    "rollout decode",
    "rollout other",
    "update forward",
    "update backward",
    "update optimizer",
    "update other",
    "step other",
]


# -- the child: one demo run with phase timers ----------------------------------------------------------------


def _matmul_rate() -> float:
    import torch

    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    a @ b
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - started)
    return 2 * 2048**3 / best


def _shared(prompts: list[list[int]]) -> int:
    if not prompts:
        return 0
    first, length = prompts[0], min(map(len, prompts))
    for prompt in prompts[1:]:
        same = 0
        while same < length and prompt[same] == first[same]:
            same += 1
        length = same
    return length


def child(steps: int, seed: int, output_dir: str, demo_args: list[str]) -> dict[str, Any]:
    import agentlightning.trainers.models as models
    import torch
    from agentlightning.trainers.backends.hf.generation import GenerationEngine
    from agentlightning.trainers.rollouts import LocalRollouts
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    import agentlightning as agl

    try:
        from examples.demo.__main__ import main
    except ModuleNotFoundError:  # a revision before 7ca1f29: the demo was agentlightning.demo
        from agentlightning.demo.__main__ import main

    events: list[tuple[float, str, int]] = []  # (time, kind, tokens)
    windows: list[dict[str, Any]] = []  # rollout-source runs: label, start, end, prompts, completions
    info: dict[str, Any] = {}

    def pre(module: Any, args: tuple, kwargs: dict) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        kind = "decode" if ids is not None and ids.shape[-1] == 1 else "prefill"
        kind = "grad" if torch.is_grad_enabled() else kind
        events.append((time.perf_counter(), f"{kind}+", 0 if ids is None else int(ids.numel())))

    def post(module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        events.append((time.perf_counter(), "forward-", 0))
        hidden = getattr(output, "last_hidden_state", None)
        if hidden is not None and hidden.requires_grad:
            hidden.register_hook(lambda grad: events.append((time.perf_counter(), "backward+", 0)))

    load = models.load_model

    def load_model(*args: Any, **kwargs: Any) -> Any:
        model, tokenizer = load(*args, **kwargs)
        # The backbone: PEFT calls the causal LM's forward() directly, past its hooks; every path calls this one.
        model.base_model.register_forward_pre_hook(pre, with_kwargs=True)
        model.base_model.register_forward_hook(post, with_kwargs=True)
        config = model.config
        embedding = model.get_input_embeddings().weight.numel()
        info.update(
            non_embedding=sum(p.numel() for p in model.parameters()) - embedding,
            logit_flops=2 * config.hidden_size * config.vocab_size,
        )
        return model, tokenizer

    models.load_model = load_model
    register_optimizer_step_pre_hook(lambda *a: events.append((time.perf_counter(), "opt+", 0)))
    register_optimizer_step_post_hook(lambda *a: events.append((time.perf_counter(), "opt-", 0)))
    requests: list[tuple[float, list[int], int]] = []  # (submitted at, prompt ids, completion tokens)
    submit = GenerationEngine.submit

    def timed_submit(self: Any, prompt_ids: list[int], *args: Any, **kwargs: Any) -> Any:
        submitted, future = time.perf_counter(), submit(self, prompt_ids, *args, **kwargs)
        future.add_done_callback(
            lambda done: requests.append(
                (submitted, list(prompt_ids), 0 if done.exception() else len(done.result().token_ids))
            )
        )
        return future

    def window(label: str, started: float) -> None:
        ended = time.perf_counter()
        mine = [(prompt, completion) for at, prompt, completion in requests if started <= at <= ended]
        windows.append(
            {
                "label": label,
                "start": started,
                "end": ended,
                "prompts": [p for p, _ in mine],
                "completions": [c for _, c in mine],
            }
        )

    run = LocalRollouts.run

    def timed_run(self: Any, tasks: Any, group_size: int, group_prefix: str, timeout: Any) -> Any:
        started = time.perf_counter()
        rollouts = run(self, tasks, group_size, group_prefix, timeout)
        window(group_prefix, started)
        return rollouts

    GenerationEngine.submit = timed_submit
    train = agl.train  # no rollout timeout: on a loaded machine slow rollouts must not become lost ones
    agl.train = lambda *args, **kwargs: train(*args, **{**kwargs, "rollout_timeout": None})
    LocalRollouts.run = timed_run  # validations (and a step's rollouts before the rollout pipeline existed)
    try:
        from agentlightning.trainers._pipeline import RolloutPipeline
    except ModuleNotFoundError:
        RolloutPipeline = None
    if RolloutPipeline is not None:  # a training step's rollouts: submitted and awaited by the pipeline
        next_step = RolloutPipeline.next_step

        def timed_next_step(self: Any, step: int, *args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            data = next_step(self, step, *args, **kwargs)
            window(f"step{step}", started)
            return data

        RolloutPipeline.next_step = timed_next_step
    info["matmul_flops"] = _matmul_rate()
    info["source"] = str(Path(models.__file__).resolve().parent)
    started = time.perf_counter()
    main(
        ["--steps", str(steps), "--seed", str(seed), "--output-dir", output_dir, "--val-every", str(steps), *demo_args]
    )
    info["wall"] = time.perf_counter() - started
    info["matmul_flops"] = min(info["matmul_flops"], _matmul_rate())
    rows = [json.loads(line) for line in (Path(output_dir) / "metrics.jsonl").read_text().splitlines()]
    return {"info": info, "events": events, "windows": windows, "rows": rows}


# -- analysis ---------------------------------------------------------------------------------------------------


def _intervals(events: list[tuple[float, str, int]]) -> list[tuple[str, float, float, int]]:
    """(kind, start, end, tokens) for forwards, backwards and optimizer steps."""
    spans, open_forward, open_backward = [], None, None
    for t, kind, tokens in events:
        if open_backward is not None and kind in ("grad+", "opt+", "prefill+", "decode+"):
            spans.append(("backward", open_backward, t, 0))
            open_backward = None
        if kind.endswith("+") and kind[:-1] in ("grad", "prefill", "decode"):
            open_forward = (kind[:-1], t, tokens)
        elif kind == "forward-" and open_forward is not None:
            spans.append((open_forward[0], open_forward[1], t, open_forward[2]))
            open_forward = None
        elif kind == "backward+":
            open_backward = open_backward or t
        elif kind == "opt+":
            opt_start = t
        elif kind == "opt-":
            spans.append(("optimizer", opt_start, t, 0))
    return spans


def _within(spans: list[tuple[str, float, float, int]], start: float, end: float, kind: str) -> float:
    return sum(e - s for k, s, e, _ in spans if k == kind and s >= start and e <= end)


def analyse(result: dict[str, Any]) -> dict[str, Any]:
    """Per-step phase seconds and limits (medians over the steps after the first) and per validation pass."""
    info, rows = result["info"], [row for row in result["rows"] if row.get("step", 0) >= 1]
    spans = _intervals([tuple(e) for e in result["events"]])
    rate, per_token, logit = info["matmul_flops"], 2 * info["non_embedding"], info["logit_flops"]
    windows = {w["label"]: w for w in result["windows"]}
    steps, validations = [], []
    for window in result["windows"]:
        shared = _shared(window["prompts"])
        prefill_tokens = shared + sum(len(p) - shared for p in window["prompts"])
        decoded = sum(window["completions"])
        limits = {
            "prefill": (prefill_tokens * per_token + len(window["prompts"]) * logit) / rate,
            "decode": decoded * (per_token + logit) / rate,
        }
        prefill = _within(spans, window["start"], window["end"], "prefill")
        decode = _within(spans, window["start"], window["end"], "decode")
        phases = {"prefill": prefill, "decode": decode, "other": window["end"] - window["start"] - prefill - decode}
        entry = {"phases": phases, "limits": limits, "shared": shared, "window": window}
        (validations if window["label"].startswith("val-") else steps).append(entry)
    per_step = []
    for row in rows:
        window = windows.get(f"step{row['step'] - 1}")
        if window is None or "train/update_seconds" not in row:
            continue
        entry = next(e for e in steps if e["window"] is window)
        update_end = window["end"] + row["step_seconds"] - row["rollout_seconds"]
        update_spans = (window["end"], update_end)
        forward = _within(spans, *update_spans, "grad")
        backward = _within(spans, *update_spans, "backward")
        optimizer = _within(spans, *update_spans, "optimizer")
        update = row["train/update_seconds"]
        shared = entry["shared"]
        batch_rows = int(row["train/rows"])
        tokens = shared + row["batch/prompt_tokens"] - batch_rows * shared + row["batch/completion_tokens"]
        forward_limit = (tokens * per_token + row["batch/completion_tokens"] * logit) / rate
        seconds = {
            "rollout prefill": entry["phases"]["prefill"],
            "rollout decode": entry["phases"]["decode"],
            "rollout other": entry["phases"]["other"],
            "update forward": forward,
            "update backward": backward,
            "update optimizer": optimizer,
            "update other": update - forward - backward - optimizer,
            "step other": row["step_seconds"] - row["rollout_seconds"] - update,
        }
        limits = {
            "rollout prefill": entry["limits"]["prefill"],
            "rollout decode": entry["limits"]["decode"],
            "update forward": forward_limit,
            "update backward": forward_limit,
        }
        per_step.append({"seconds": seconds, "limits": limits, "total": row["step_seconds"]})
    measured = per_step[1:] or per_step
    median = {phase: statistics.median(s["seconds"][phase] for s in measured) for phase in PHASES}
    limit = {phase: statistics.median(s["limits"].get(phase, 0.0) for s in measured) for phase in PHASES}
    validation = validations[-1] if validations else None
    return {
        "step": statistics.median(s["total"] for s in measured),
        "phases": median,
        "limits": limit,
        "validation": None
        if validation is None
        else {
            "seconds": sum(validation["phases"].values()),
            "phases": validation["phases"],
            "limit": sum(validation["limits"].values()),
        },
        "matmul_gflops": rate / 1e9,
        "wall": info["wall"],
        "steps": len(rows),
    }


# -- the parent: baseline and current side by side --------------------------------------------------------------


def _baseline_tree(revision: str, directory: Path) -> Path:
    directory.mkdir()
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-tree", "--name-only", revision], check=True, capture_output=True, text=True
    ).stdout.split()
    paths = [path for path in ("agentlightning", "adapters", "trainers", "examples") if path in listed]
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", revision, *paths], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(directory)], input=archive, check=True)
    (directory / "agentlightning" / "trainers").symlink_to(directory / "trainers")
    (directory / "agentlightning" / "adapters").symlink_to(directory / "adapters")
    return directory


def _run_child(pythonpath: Path, steps: int, seed: int, workdir: Path, demo_args: str) -> dict[str, Any]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["PYTHONPATH"] = str(pythonpath)  # its agentlightning (before the editable install's) and its examples
    out = workdir / "result.json"
    subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            "--steps",
            str(steps),
            "--seed",
            str(seed),
            "--output-dir",
            str(workdir / "run"),
            "--json",
            str(out),
            f"--demo-args={demo_args}",
        ],
        env=env,
        check=True,
        cwd=workdir,
        stdout=subprocess.DEVNULL,
    )
    return json.loads(out.read_text())


def _report(results: dict[str, list[dict[str, Any]]]) -> str:
    sides = {side: [analyse(r) for r in runs] for side, runs in results.items()}
    med = lambda side, get: statistics.median(get(a) for a in sides[side])  # noqa: E731
    lines = [
        f"{'phase (s per step)':22} {'baseline':>9} {'limit':>7} {'x limit':>8} | {'current':>9} {'limit':>7} "
        f"{'x limit':>8} | {'cur/base':>8}"
    ]
    for phase in PHASES + ["step total"]:
        cells = []
        for side in ("baseline", "current"):
            seconds = med(side, lambda a, phase=phase: a["step"] if phase == "step total" else a["phases"][phase])
            limit = med(
                side, lambda a, phase=phase: sum(a["limits"].values()) if phase == "step total" else a["limits"][phase]
            )
            cells.append((seconds, limit))
        (b, bl), (c, cl) = cells
        ratio = lambda s, lim: f"{s / lim:8.2f}" if lim > 0 else f"{'-':>8}"  # noqa: E731
        lines.append(
            f"{phase:22} {b:9.2f} {bl:7.2f} {ratio(b, bl)} | {c:9.2f} {cl:7.2f} {ratio(c, cl)} | "
            f"{(c / b if b else float('nan')):8.2f}"
        )
    for side in ("baseline", "current"):
        val = [a["validation"] for a in sides[side] if a["validation"]]
        if val:
            seconds, limit = statistics.median(v["seconds"] for v in val), statistics.median(v["limit"] for v in val)
            lines.append(f"validation pass ({side}): {seconds:.2f} s, limit {limit:.2f} s, x{seconds / limit:.2f}")
        lines.append(
            f"{side}: matmul {med(side, lambda a: a['matmul_gflops']):.0f} GFLOP/s, "
            f"run wall {med(side, lambda a: a['wall']):.0f} s, code from {results[side][0]['info']['source']}"
        )
    return "\n".join(lines)


def bench(steps: int = 3, repeats: int = 1, baseline: str = BASELINE, seed: int = 0, demo_args: str = "") -> str:
    results: dict[str, list[dict[str, Any]]] = {"baseline": [], "current": []}
    with tempfile.TemporaryDirectory(prefix="agl-bench-demo-") as tmp:
        tree = _baseline_tree(baseline, Path(tmp) / "baseline-src")
        for repeat in range(repeats):
            for side, path in (("baseline", tree), ("current", REPO)):
                workdir = Path(tmp) / f"{side}-{repeat}"
                workdir.mkdir()
                results[side].append(_run_child(path, steps, seed, workdir, demo_args))
    return _report(results)


def test_bench_demo_step() -> None:
    print("\n" + bench(steps=int(os.environ.get("AGL_BENCH_STEPS", "3"))))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--baseline", default=BASELINE)
    parser.add_argument(
        "--demo-args", default="", help="more options for both sides' demo, e.g. '--tasks-per-step 4 --group-size 8'"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--output-dir", help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        result = child(options.steps, options.seed, options.output_dir, shlex.split(options.demo_args))
        Path(options.json).write_text(json.dumps(result))
    else:
        print(bench(options.steps, options.repeats, options.baseline, options.seed, options.demo_args))
