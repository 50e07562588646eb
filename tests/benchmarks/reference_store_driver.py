"""Drive the reference project's store (``agentlightning==0.3.0``) with the Lightning Server benchmark's workload.

Runs ONLY under the reference virtual environment (``.venv-ref``, see ``make bench-reference-venv``), never under
ours: it imports the 0.3.0 ``agentlightning`` package. ``bench_reference.py`` starts it as a subprocess.

What it does, with 0.3.0's own parts only:

- starts 0.3.0's store server with its own CLI entry point (``agentlightning.cli.store.main``, i.e. ``agl store``:
  an ``InMemoryLightningStore`` behind ``LightningStoreServer``) in a forked process on a free loopback port;
- registers the upstream as an ``LLM`` resource and enqueues R rollouts (``enqueue_many_rollouts``);
- N worker processes, each with its own ``LightningStoreClient``, do what 0.3.0's ``LitAgentRunner`` does per
  rollout: ``dequeue_rollout`` -> ``get_resources_by_id`` -> run the agent (K chat calls with the real ``openai``
  client, each with the conversation so far and ``return_token_ids``, as 0.3.0's LLM proxy would add) -> one span
  per call the way its OTel exporter stores them (``get_next_span_sequence_id`` + ``add_span``, with the prompt,
  completion and token ids as ``gen_ai.*`` / ``prompt_token_ids`` / ``response_token_ids`` attributes) -> a reward
  span from ``emit_reward`` -> ``update_attempt(status="succeeded")``;
- times from the enqueue until every worker has finished its ``update_attempt`` for the batch, after a warm-up
  batch; then checks in the store that every rollout succeeded with K+1 spans and that 0.3.0's own
  ``TracerTraceToTriplet`` adapter turns one of them into K triplets with token ids and the reward;
- prints one JSON line: rollouts/s, failures, CPU ms per rollout of the store server, the workers and the upstream.

Differences from our path, all in the reference's favour: the calls go straight to the upstream (no proxy hop),
idle workers poll every 20 ms (0.3.0's runner default is 5 s), no worker heartbeats, and completion is counted by
the workers rather than by polling the store.

    .venv-ref/bin/python tests/benchmarks/reference_store_driver.py --upstream http://127.0.0.1:PORT/v1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import sys
import time
import uuid
from importlib.metadata import version
from multiprocessing.process import BaseProcess
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

REFERENCE_VERSION = "0.3.0"
if version("agentlightning") != REFERENCE_VERSION:  # before importing it: our package has other modules
    sys.exit(f"reference_store_driver.py needs agentlightning=={REFERENCE_VERSION} (the separate venv made by "
             f"`make bench-reference-venv`), found {version('agentlightning')}: run it with .venv-ref/bin/python")
# 0.3.0 imports litellm, which otherwise tries to download its model cost map on import (loopback only here).
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"

import httpx
import openai
from agentlightning.adapter.triplet import TracerTraceToTriplet
from agentlightning.cli import store as store_cli
from agentlightning.emitter.reward import emit_reward, find_final_reward
from agentlightning.store.client_server import LightningStoreClient
from agentlightning.types import LLM, EnqueueRolloutRequest, Span

POLL_INTERVAL = 0.02


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds used so far by the processes ``pids`` (Linux /proc)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def _call_span(
    rollout_id: str, attempt_id: str, sequence_id: int, trace_id: str, model: str,
    messages: list[dict[str, str]], reply: Any, start: float, end: float,
) -> Span:
    """The span 0.3.0's tracer + LLM proxy would store for one chat call (``openai.chat.completion``)."""
    attributes: dict[str, Any] = {"gen_ai.request.model": model, "gen_ai.response.id": reply.id,
                                  "gen_ai.response.model": reply.model}
    for index, message in enumerate(messages):
        attributes[f"gen_ai.prompt.{index}.role"] = message["role"]
        attributes[f"gen_ai.prompt.{index}.content"] = message["content"]
    choice = reply.choices[0]
    attributes["gen_ai.completion.0.role"] = "assistant"
    attributes["gen_ai.completion.0.content"] = choice.message.content or ""
    attributes["gen_ai.completion.0.finish_reason"] = choice.finish_reason
    extra = reply.model_extra or {}
    attributes["prompt_token_ids"] = list(extra.get("prompt_token_ids") or [])
    attributes["response_token_ids"] = list((choice.model_extra or {}).get("token_ids") or [])
    if reply.usage is not None:
        attributes["gen_ai.usage.prompt_tokens"] = reply.usage.prompt_tokens
        attributes["gen_ai.usage.completion_tokens"] = reply.usage.completion_tokens
    return Span.from_attributes(
        attributes=attributes, rollout_id=rollout_id, attempt_id=attempt_id, sequence_id=sequence_id,
        name="openai.chat.completion", trace_id=trace_id, start_time=start, end_time=end,
    )


async def _run_rollout(store: LightningStoreClient, client_cache: dict[str, openai.AsyncOpenAI], attempted: Any) -> None:
    rollout_id, attempt_id = attempted.rollout_id, attempted.attempt.attempt_id
    resources = await store.get_resources_by_id(attempted.resources_id)
    if resources is None:
        raise RuntimeError(f"rollout {rollout_id}: resources {attempted.resources_id!r} not found in the store")
    llm = resources.resources["main_llm"]
    client = client_cache.get(llm.endpoint)
    if client is None:
        client = client_cache[llm.endpoint] = openai.AsyncOpenAI(base_url=llm.endpoint, api_key="none", max_retries=0)
    task = attempted.input
    trace_id = uuid.uuid4().hex
    messages: list[dict[str, str]] = []
    good = 0
    for turn in range(task["calls"]):
        question = f"{task['question']} turn {turn}"
        messages.append({"role": "user", "content": question})
        start = time.time()
        reply = await client.chat.completions.create(
            model=llm.model, messages=messages, max_tokens=16, extra_body={"return_token_ids": True})
        end = time.time()
        answer = reply.choices[0].message.content or ""
        sequence_id = await store.get_next_span_sequence_id(rollout_id, attempt_id)
        await store.add_span(_call_span(rollout_id, attempt_id, sequence_id, trace_id, llm.model, list(messages),
                                        reply, start, end))
        messages.append({"role": "assistant", "content": answer})
        good += question in answer
    reward = emit_reward(good / task["calls"], propagate=False)
    sequence_id = await store.get_next_span_sequence_id(rollout_id, attempt_id)
    await store.add_span(Span.from_core_fields(reward, rollout_id=rollout_id, attempt_id=attempt_id,
                                               sequence_id=sequence_id))
    await store.update_attempt(rollout_id, attempt_id, status="succeeded")


async def _worker_loop(store_url: str, worker_id: str, stop: Event, done: Synchronized) -> None:
    store = LightningStoreClient(store_url)
    clients: dict[str, openai.AsyncOpenAI] = {}
    try:
        while not stop.is_set():
            attempted = await store.dequeue_rollout(worker_id=worker_id)
            if attempted is None:
                await asyncio.sleep(POLL_INTERVAL)
                continue
            try:
                await _run_rollout(store, clients, attempted)
            except Exception as exc:  # the rollout counts as failed; the check in the store reports it
                print(f"{worker_id}: rollout {attempted.rollout_id} failed: {exc!r}", file=sys.stderr, flush=True)
                await store.update_attempt(attempted.rollout_id, attempted.attempt.attempt_id, status="failed")
            with done.get_lock():
                done.value += 1
    finally:
        await store.close()


def worker_main(store_url: str, worker_id: str, stop: Event, done: Synchronized) -> None:
    """Entry point of one worker process."""
    asyncio.run(_worker_loop(store_url, worker_id, stop, done))


async def _run_batch(store: LightningStoreClient, done: Synchronized, tasks: list[dict], resources_id: str) -> list[str]:
    with done.get_lock():
        done.value = 0
    rollouts = await store.enqueue_many_rollouts(
        [EnqueueRolloutRequest(input=task, mode="train", resources_id=resources_id) for task in tasks])
    while done.value < len(tasks):
        await asyncio.sleep(0.005)
    return [rollout.rollout_id for rollout in rollouts]


async def _check(store: LightningStoreClient, ids: list[str], calls: int) -> dict[str, Any]:
    """Count rollouts that did not succeed with ``calls`` + 1 spans; adapt one rollout with 0.3.0's adapter."""
    rows = await store.query_rollouts(rollout_id_in=ids)
    failed = len(ids) - sum(1 for row in rows if row.status == "succeeded")
    for rollout_id in ids:
        spans = (await store.query_spans(rollout_id, "latest")).items
        failed += len(spans) != calls + 1
    spans = list((await store.query_spans(ids[-1], "latest")).items)
    triplets = TracerTraceToTriplet().adapt(spans)
    return {
        "failed": failed,
        "sample_triplets": len(triplets),
        "sample_triplets_with_token_ids": sum(1 for t in triplets if t.prompt["token_ids"] and t.response["token_ids"]),
        "sample_final_reward": find_final_reward(spans),
    }


async def _drive(store_url: str, args: argparse.Namespace, pids: dict[str, list[int]], done: Synchronized) -> dict[str, Any]:
    store = LightningStoreClient(store_url)
    try:
        resources = await store.add_resources({"main_llm": LLM(endpoint=args.upstream, model=args.model)})
        warm = [{"question": f"warm {i}", "calls": args.calls} for i in range(args.workers * 4)]
        await _run_batch(store, done, warm, resources.resources_id)
        tasks = [{"question": f"question {i}", "calls": args.calls} for i in range(args.rollouts)]
        before = {name: cpu_seconds(group) for name, group in pids.items()}
        start = time.perf_counter()
        ids = await _run_batch(store, done, tasks, resources.resources_id)
        elapsed = time.perf_counter() - start
        cpu_ms = {name: (cpu_seconds(group) - before[name]) * 1000 / args.rollouts for name, group in pids.items()}
        checks = await _check(store, ids, args.calls)
    finally:
        await store.close()
    return {"reference": f"agentlightning=={REFERENCE_VERSION}",
            "store": "InMemoryLightningStore via LightningStoreServer/LightningStoreClient",
            "workers": args.workers, "rollouts": args.rollouts, "calls": args.calls,
            "rollouts_per_s": args.rollouts / elapsed, "seconds": elapsed, "cpu_ms": cpu_ms, **checks}


def _wait_store(server: BaseProcess, url: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if not server.is_alive():
            raise RuntimeError(f"the reference store server exited with {server.exitcode}")
        try:
            if httpx.get(f"{url}/v1/agl/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"the reference store server did not answer {url}/v1/agl/health within 60 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="OpenAI-compatible base URL of the mock upstream")
    parser.add_argument("--upstream-pid", type=int, default=0, help="pid of the upstream, for its CPU time")
    parser.add_argument("--model", default="mock-model")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rollouts", type=int, default=600)
    parser.add_argument("--calls", type=int, default=6)
    args = parser.parse_args()
    # fork, not spawn: importing 0.3.0 (litellm's proxy) costs ~7 CPU-seconds per process, which forks inherit.
    context = multiprocessing.get_context("fork")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    argv = ["--host", "127.0.0.1", "--port", str(port), "--log-level", "WARNING"]
    server = context.Process(target=store_cli.main, args=(argv,), name="reference-store", daemon=True)
    stop, done = context.Event(), context.Value("i", 0)
    workers = [context.Process(target=worker_main, args=(url, f"ref-worker-{i}", stop, done), daemon=True)
               for i in range(args.workers)]
    server.start()
    try:
        _wait_store(server, url)
        for worker in workers:
            worker.start()
        pids = {"server": [server.pid or 0], "workers": [worker.pid or 0 for worker in workers],
                "upstream": [args.upstream_pid] if args.upstream_pid else []}
        figures = asyncio.run(_drive(url, args, pids, done))
    finally:
        stop.set()
        for process in [*workers, server]:
            if process.pid is None:
                continue
            if process is server:
                process.terminate()
            process.join(10)
            if process.is_alive():
                process.kill()
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
