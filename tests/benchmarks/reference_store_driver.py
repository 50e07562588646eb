"""Drive the reference project's store (``agentlightning==0.3.0``) with the Lightning Server benchmark's workload.

Runs ONLY under the reference virtual environment (``.venv-ref``, see ``make bench-reference-venv``), never under
ours: it imports the 0.3.0 ``agentlightning`` package. ``bench_reference.py`` starts it as a subprocess.

What it does, with 0.3.0's own parts only (our code here is the agent and the timing):

- starts 0.3.0's store server with its own CLI entry point (``agentlightning.cli.store.main``, i.e. ``agl store``:
  an ``InMemoryLightningStore`` behind ``LightningStoreServer``) in a forked process on a free loopback port;
- registers the upstream as an ``LLM`` resource and enqueues R rollouts at once (``enqueue_many_rollouts``);
- N forked worker processes each run what 0.3.0's client-server execution strategy runs per runner: a
  ``LitAgentRunner`` with an ``OtelTracer`` over its own ``LightningStoreClient`` (dequeue, resources, trace
  context, agent, reward span, ``update_attempt``, heartbeats). The agent is ``bench_server.run_agent`` as a
  ``LitAgent``: K chat calls with the real ``openai`` client, each with the conversation so far and
  ``return_token_ids`` (what 0.3.0's LLM proxy adds), each recorded as an ``openai.chat.completion`` span with the
  prompt, completion and token ids, exported to the store by the tracer (OTLP/HTTP, one request per span);
- times from the enqueue until the store has no unfinished rollout (polled every 20 ms, as ours is), after a
  warm-up batch; then checks that every rollout succeeded with K+1 spans, and that 0.3.0's own
  ``TracerTraceToTriplet`` adapter turns one of them into K triplets with token ids and the reward;
- prints one JSON line: rollouts/s, failures, CPU ms per rollout of the store server, the workers and the upstream.

Differences from our path, both in the reference's favour: the calls go straight to the upstream (0.3.0 would put
its LiteLLM proxy in between to get token ids; ours goes through our proxy), and idle workers poll every 20 ms
(0.3.0's runner default is 5 s, which would leave workers idle for most of a short benchmark).

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
from importlib.metadata import version
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

REFERENCE_VERSION = "0.3.0"
if version("agentlightning") != REFERENCE_VERSION:  # before importing it: our package has other modules
    sys.exit(
        f"reference_store_driver.py needs agentlightning=={REFERENCE_VERSION} (the separate venv made by "
        f"`make bench-reference-venv`), found {version('agentlightning')}: run it with .venv-ref/bin/python"
    )
if tuple(int(part) for part in version("opentelemetry-exporter-otlp-proto-http").split(".")[:2]) >= (1, 45):
    sys.exit(
        "0.3.0's tracer cannot point opentelemetry-exporter-otlp-proto-http>=1.45 at its store (spans would go "
        "to localhost:4318); install the 1.44.0 OpenTelemetry packages as `make bench-reference-venv` does"
    )
# 0.3.0 imports litellm, which otherwise tries to download its model cost map on import (loopback only here).
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"

import httpx
import openai
from agentlightning.adapter.triplet import TracerTraceToTriplet
from agentlightning.cli import store as store_cli
from agentlightning.emitter.reward import find_final_reward
from agentlightning.litagent import LitAgent
from agentlightning.runner import LitAgentRunner
from agentlightning.store.client_server import LightningStoreClient
from agentlightning.tracer import OtelTracer
from opentelemetry import trace as trace_api

from agentlightning.types import LLM, EnqueueRolloutRequest, NamedResources, Rollout

POLL_INTERVAL = 0.02  # 0.3.0's runner default is 5 s: idle workers would miss most of a short benchmark
UNFINISHED = ["queuing", "preparing", "running", "requeuing"]
BATCH_TIMEOUT = 600.0


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


def _call_attributes(model: str, messages: list[dict[str, str]], reply: Any) -> dict[str, Any]:
    """What 0.3.0's tracing + LLM proxy record for one chat call: prompt, completion, usage and token ids."""
    attributes: dict[str, Any] = {
        "gen_ai.request.model": model,
        "gen_ai.response.id": reply.id,
        "gen_ai.response.model": reply.model,
    }
    for index, message in enumerate(messages):
        attributes[f"gen_ai.prompt.{index}.role"] = message["role"]
        attributes[f"gen_ai.prompt.{index}.content"] = message["content"]
    choice = reply.choices[0]
    attributes["gen_ai.completion.0.role"] = "assistant"
    attributes["gen_ai.completion.0.content"] = choice.message.content or ""
    attributes["gen_ai.completion.0.finish_reason"] = choice.finish_reason
    attributes["prompt_token_ids"] = list((reply.model_extra or {}).get("prompt_token_ids") or [])
    attributes["response_token_ids"] = list((choice.model_extra or {}).get("token_ids") or [])
    if reply.usage is not None:
        attributes["gen_ai.usage.prompt_tokens"] = reply.usage.prompt_tokens
        attributes["gen_ai.usage.completion_tokens"] = reply.usage.completion_tokens
    return attributes


class EchoAgent(LitAgent[dict]):
    """K chat calls, each with the conversation so far; reward 1 if every answer echoed its question.

    The same agent as ``bench_server.run_agent``, written against 0.3.0's ``LitAgent``. Each call is one
    ``openai.chat.completion`` OpenTelemetry span, which 0.3.0's ``OtelTracer`` exports to the store.
    """

    def __init__(self) -> None:
        super().__init__()
        self._clients: dict[str, openai.AsyncOpenAI] = {}

    async def training_rollout_async(self, task: dict, resources: NamedResources, rollout: Rollout) -> float:
        llm = resources["main_llm"]
        assert isinstance(llm, LLM)
        client = self._clients.get(llm.endpoint)
        if client is None:
            client = self._clients[llm.endpoint] = openai.AsyncOpenAI(
                base_url=llm.endpoint, api_key="none", max_retries=0
            )
        tracer = trace_api.get_tracer(__name__)
        messages: list[dict[str, str]] = []
        good = 0
        for turn in range(task["calls"]):
            question = f"{task['question']} turn {turn}"
            messages.append({"role": "user", "content": question})
            with tracer.start_as_current_span("openai.chat.completion") as span:
                reply = await client.chat.completions.create(
                    model=llm.model, messages=messages, max_tokens=16, extra_body={"return_token_ids": True}
                )
                span.set_attributes(_call_attributes(llm.model, messages, reply))
            answer = reply.choices[0].message.content or ""
            messages.append({"role": "assistant", "content": answer})
            good += question in answer
        return good / task["calls"]


async def _run_worker(store_url: str, worker_id: int, stop: Event) -> None:
    """What 0.3.0's client-server execution strategy runs in each runner process (``Trainer._runner_bundle``)."""
    store = LightningStoreClient(store_url)
    runner: LitAgentRunner[dict] = LitAgentRunner(OtelTracer(), poll_interval=POLL_INTERVAL, interval_jitter=0.0)
    runner.init(agent=EchoAgent())
    runner.init_worker(worker_id, store)
    try:
        await runner.iter(event=stop)
    finally:
        runner.teardown_worker(worker_id)
        runner.teardown()
        await store.close()


def worker_main(store_url: str, worker_id: int, stop: Event) -> None:
    """Entry point of one worker process."""
    asyncio.run(_run_worker(store_url, worker_id, stop))


async def _run_batch(store: LightningStoreClient, tasks: list[dict], resources_id: str) -> list[str]:
    """Enqueue ``tasks`` and return their rollout ids once none of them is left unfinished."""
    rollouts = await store.enqueue_many_rollouts(
        [EnqueueRolloutRequest(input=task, mode="train", resources_id=resources_id) for task in tasks]
    )
    ids = [rollout.rollout_id for rollout in rollouts]
    deadline = time.monotonic() + BATCH_TIMEOUT
    while unfinished := (await store.query_rollouts(status_in=UNFINISHED, limit=1)).total:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{unfinished} of {len(tasks)} rollouts still unfinished after {BATCH_TIMEOUT} s")
        await asyncio.sleep(0.02)
    return ids


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


async def _drive(store_url: str, args: argparse.Namespace, pids: dict[str, list[int]]) -> dict[str, Any]:
    store = LightningStoreClient(store_url)
    try:
        resources = await store.add_resources({"main_llm": LLM(endpoint=args.upstream, model=args.model)})
        warm = [{"question": f"warm {i}", "calls": args.calls} for i in range(args.workers * 4)]
        await _run_batch(store, warm, resources.resources_id)
        tasks = [{"question": f"question {i}", "calls": args.calls} for i in range(args.rollouts)]
        before = {name: cpu_seconds(group) for name, group in pids.items()}
        start = time.perf_counter()
        ids = await _run_batch(store, tasks, resources.resources_id)
        elapsed = time.perf_counter() - start
        cpu_ms = {name: (cpu_seconds(group) - before[name]) * 1000 / args.rollouts for name, group in pids.items()}
        checks = await _check(store, ids, args.calls)
    finally:
        await store.close()
    return {
        "reference": f"agentlightning=={REFERENCE_VERSION}",
        "store": "InMemoryLightningStore via LightningStoreServer/LightningStoreClient",
        "workers": args.workers,
        "rollouts": args.rollouts,
        "calls": args.calls,
        "rollouts_per_s": args.rollouts / elapsed,
        "seconds": elapsed,
        "cpu_ms": cpu_ms,
        **checks,
    }


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
    stop = context.Event()
    workers = [context.Process(target=worker_main, args=(url, i, stop), daemon=True) for i in range(args.workers)]
    server.start()
    try:
        _wait_store(server, url)
        for worker in workers:
            worker.start()
        pids = {
            "server": [server.pid or 0],
            "workers": [worker.pid or 0 for worker in workers],
            "upstream": [args.upstream_pid] if args.upstream_pid else [],
        }
        figures = asyncio.run(_drive(url, args, pids))
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
