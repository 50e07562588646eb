"""Capture of agents that use the openai client directly, the way its docs write them: streams left early through
the ``.stream()`` helpers, LLM calls fanned out over a thread pool, and what the rollout says about calls it could
not capture."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import shutil
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from adapter_support import timeline

import agentlightning as agl
from agentlightning.testing import MockLLMServer, MockReply, MockRequest

ANSWER = "the answer is forty two, said the model slowly"


def answer(request: MockRequest) -> MockReply:
    if request.last_user_text == "please fail":
        return MockReply(status=400, error_message="bad request")
    return MockReply(content=f"{ANSWER} ({request.last_user_text})")


@contextlib.contextmanager
def no_cyclic_gc() -> Iterator[None]:
    """What a user gets between two runs of the cyclic collector: nothing found only by it is recorded."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def question(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_streams_left_early_are_recorded_when_closed(serve) -> None:
    server, model = serve(answer)

    @agl.rollout(roles=["streamer"])
    @agl.role("streamer")
    def agent(task: dict, llm: agl.LLM) -> float:
        client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key)
        heard = []
        with client.chat.completions.stream(model=llm.model, messages=question("one")) as stream:
            for event in stream:
                if event.type == "content.delta":
                    heard.append(event.delta)
                    break
        with client.responses.stream(model=llm.model, input="two") as stream:
            for event in stream:
                if event.type == "response.output_text.delta":
                    break
        with client.chat.completions.create(model=llm.model, messages=question("three"), stream=True) as chunks:
            for _chunk in chunks:
                break
        return float(bool(heard))

    with no_cyclic_gc():
        (rollout,) = agl.run(agent, [{"id": 1}], llm=server.llm())
    assert timeline(rollout) == [("llm", "streamer", "ok")] * 3
    assert len(rollout.llm_calls) == len(server.requests) == 3
    assert [call.metadata["api"] for call in rollout.llm_calls] == ["chat.completions", "responses", "chat.completions"]
    for call in rollout.llm_calls:
        assert call.output["finish_reason"] == "incomplete_stream"
        assert ANSWER.startswith(call.output["content"] or "")
        if call.metadata["api"] == "chat.completions":  # a Responses stream sends its ids with its last event
            model.assert_server_token_ids(call, partial=True)
    assert rollout.diagnostics == []


async def test_async_streams_left_early_are_recorded_when_closed(serve) -> None:
    server, model = serve(answer)

    @agl.rollout
    async def agent(task: dict, llm: agl.LLM) -> float:
        client = openai.AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key)
        async with client.chat.completions.stream(model=llm.model, messages=question("one")) as stream:
            async for event in stream:
                if event.type == "content.delta":
                    break
        async with client.responses.stream(model=llm.model, input="two") as stream:
            async for event in stream:
                if event.type == "response.output_text.delta":
                    break
        async with await client.chat.completions.create(model=llm.model, messages=question("3"), stream=True) as s:
            async for _chunk in s:
                break
        return 1.0

    with no_cyclic_gc():
        (rollout,) = await agl.arun(agent, [{"id": 1}], llm=server.llm())
    assert timeline(rollout) == [("llm", None, "ok")] * 3
    assert len(rollout.llm_calls) == len(server.requests) == 3
    for call in rollout.llm_calls:
        assert call.output["finish_reason"] == "incomplete_stream"
        if call.metadata["api"] == "chat.completions":
            model.assert_server_token_ids(call, partial=True)


def test_thread_pool_fan_out_is_captured(serve) -> None:
    server, model = serve(answer)
    questions = [f"question {i}" for i in range(8)]

    @agl.rollout(roles=["solver"])
    def agent(task: dict, llm: agl.LLM) -> float:
        client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key)

        @agl.role("solver")
        def solve(text: str) -> str:
            reply = client.chat.completions.create(model=llm.model, messages=question(text))
            return reply.choices[0].message.content

        with ThreadPoolExecutor(max_workers=4) as pool:
            answers = list(pool.map(solve, task["questions"]))
        return float(all(ANSWER in text for text in answers))

    rollouts = agl.run(
        agent, [{"id": 1, "questions": questions}, {"id": 2, "questions": questions}], llm=server.llm(), n_workers=2
    )
    assert len(server.requests) == 16
    for rollout in rollouts:
        assert timeline(rollout) == [("llm", "solver", "ok")] * 8
        assert sorted(call.input[-1]["content"] for call in rollout.llm_calls) == sorted(questions)
        for call in rollout.llm_calls:
            model.assert_server_token_ids(call)
        assert rollout.final_reward == 1.0 and rollout.diagnostics == []
        assert len(agl.transitions([rollout], roles=["solver"])) == 8


async def test_loop_executor_fan_out_is_captured(serve) -> None:
    # loop.run_in_executor submits to a pool without copying the context (asyncio.to_thread does copy it).
    server, model = serve(answer)

    @agl.rollout
    async def agent(task: dict, llm: agl.LLM) -> float:
        client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key)
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(max_workers=2) as pool:
            await asyncio.gather(
                *(
                    loop.run_in_executor(
                        pool, lambda t=t: client.chat.completions.create(model=llm.model, messages=question(t))
                    )
                    for t in ("a", "b")
                )
            )
        return 1.0

    rollout = await agent.aexecute({}, server.llm())
    assert timeline(rollout) == [("llm", None, "ok")] * 2
    for call in rollout.llm_calls:
        model.assert_server_token_ids(call)


def test_calls_that_escape_the_rollout_are_reported_even_when_others_were_captured(serve) -> None:
    server, _ = serve(answer)

    @agl.rollout(roles=["writer"])
    def agent(task: dict, llm: agl.LLM) -> float:
        client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key)
        with agl.role("writer"):
            client.chat.completions.create(model=llm.model, messages=question("captured"))
        client.chat.completions.create(model=llm.model, messages=question("no role"))
        thread = threading.Thread(
            target=client.chat.completions.create,  # a bare thread: a fresh context
            kwargs={"model": llm.model, "messages": question("lost")},
        )
        thread.start()
        thread.join()
        return 1.0

    (rollout,) = agl.run(agent, [{"id": 1}], llm=server.llm())
    assert timeline(rollout) == [("llm", "writer", "ok"), ("llm", None, "ok")]
    assert len(server.requests) == 3
    lost = [note for note in rollout.diagnostics if note.startswith("not every LLM call was captured")]
    assert len(lost) == 1 and "1 openai call(s)" in lost[0] and "copy_context" in lost[0]
    assert any("1 of the 2 LLM calls had no role" in note for note in rollout.diagnostics), rollout.diagnostics


@pytest.mark.parametrize("name", ["curl_agent", "httpx_agent"])
def test_raw_http_agent_trains_through_the_server_proxy(tmp_path, name: str) -> None:
    """An agent whose calls another program makes (curl, for any non-Python client): agl.run sees no call and says
    why; the Lightning server's proxy, which client workers point the agent at, records every call with the server's
    token ids. An agent sending them with httpx is captured by agl.run too, and joined with the proxy's records."""
    import raw_http_agents

    if name == "curl_agent" and shutil.which("curl") is None:
        pytest.skip("needs curl, the non-Python client")
    agent = getattr(raw_http_agents, name)

    from agentlightning.client import start_workers
    from agentlightning.server import LightningServer

    with MockLLMServer() as upstream:
        (alone,) = agl.run(agent, [{"id": 1, "question": "q"}], llm=upstream.llm())
        assert alone.status == "succeeded" and len(upstream.requests) == 2
        if name == "curl_agent":
            assert alone.llm_calls == [] and "only through the server's proxy" in alone.diagnostics[0]
        else:
            assert len(alone.llm_calls) == 2 and not alone.diagnostics, alone.diagnostics
        with LightningServer(tmp_path / "s.db", upstream_url=upstream.base_url, model_name="mock-model") as server:
            ids = server.enqueue([{"id": f"t{i}", "question": f"question {i}"} for i in range(2)])
            pool = start_workers(agent, server.url, nworkers=1, spool_dir=str(tmp_path / "spool"))
            try:
                rollouts = server.wait(ids, timeout=60)
            finally:
                server.request_stop()
                assert pool.wait(20)
    assert len(upstream.requests) == 2 + 4
    for rollout in rollouts:
        assert rollout.status == "succeeded" and rollout.final_reward == 1.0
        assert [(call.metadata.get("stream", False), call.token_source) for call in rollout.llm_calls] == [
            (False, "server"),
            (True, "server"),
        ]
        for call in rollout.llm_calls:
            assert call.output["content"] == f"echo: {rollout.task['question']}"
            assert call.completion_token_ids == upstream.tokenizer.encode(call.output["content"])


def test_a_stream_never_read_is_reported_even_when_other_calls_were_captured(serve) -> None:
    server, _ = serve(answer)
    kept = []

    @agl.rollout
    def agent(task: dict, llm: agl.LLM) -> float:
        client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key)
        client.chat.completions.create(model=llm.model, messages=question("read"))
        kept.append(client.chat.completions.create(model=llm.model, messages=question("unread"), stream=True))
        return 1.0

    (rollout,) = agl.run(agent, [{"id": 1}], llm=server.llm())
    kept[0].close()
    assert timeline(rollout) == [("llm", None, "ok")] and len(server.requests) == 2
    (lost,) = rollout.diagnostics
    assert lost.startswith(f"not every LLM call was captured: Calls to {server.base_url} started but never finished")


def test_raw_httpx_agent_is_captured(serve) -> None:
    """An agent that speaks the OpenAI API itself with httpx, as an OpenAI-compatible server's docs show it."""
    server, model = serve(answer)

    @agl.rollout(roles=["planner"])
    def agent(task: dict, llm: agl.LLM) -> float:
        headers = {"Authorization": f"Bearer {llm.api_key}"}
        body = {"model": llm.model, "messages": question(task["question"]), "temperature": 0.5}
        with agl.role("planner"):
            plan = httpx.post(f"{llm.base_url}/chat/completions", json=body, headers=headers, timeout=30).json()
        text = []
        with httpx.Client(base_url=llm.base_url, headers=headers) as client:
            with client.stream("POST", "/chat/completions", json={**body, "stream": True}) as response:
                for line in response.iter_lines():
                    if line.startswith("data: {"):
                        text += [c["delta"].get("content") or "" for c in json.loads(line[6:])["choices"]]
            failed = client.post("/chat/completions", json={**body, "messages": question("please fail")})
            client.post("/responses", json={"model": llm.model, "input": "summarise"}).raise_for_status()
        return float(
            ANSWER in plan["choices"][0]["message"]["content"] and ANSWER in "".join(text) and failed.status_code == 400
        )

    (rollout,) = agl.run(agent, [{"id": 1, "question": "plan it"}], llm=server.llm())
    assert timeline(rollout) == [
        ("llm", "planner", "ok"),
        ("llm", None, "ok"),
        ("llm", None, "error"),
        ("llm", None, "ok"),
    ]
    assert rollout.final_reward == 1.0
    assert len(rollout.llm_calls) == len(server.requests) == 4
    plan, streamed, failed, summary = rollout.llm_calls
    assert plan.metadata["sampling"] == {"temperature": 0.5} and plan.metadata["endpoint"] == server.base_url
    assert streamed.metadata["stream"] is True and streamed.output["finish_reason"] == "stop"
    assert failed.error.startswith("HTTPStatusError: HTTP 400")
    assert summary.metadata["api"] == "responses" and summary.output["content"].startswith(ANSWER)
    for call in (plan, streamed, summary):
        model.assert_server_token_ids(call)
    assert [t.role for t in agl.transitions([rollout], roles=["planner"])] == ["planner"]


async def test_raw_async_httpx_agent_is_captured(serve) -> None:
    server, model = serve(answer)

    @agl.rollout
    async def agent(task: dict, llm: agl.LLM) -> float:
        body = {"model": llm.model, "messages": question("async")}
        async with httpx.AsyncClient(base_url=llm.base_url) as client:
            replies = await asyncio.gather(*(client.post("/chat/completions", json=body) for _ in range(3)))
            async with client.stream("POST", "/chat/completions", json={**body, "stream": True}) as response:
                async for _line in response.aiter_lines():
                    break  # left early: recorded as an incomplete stream when the block closes it
        return float(all(reply.status_code == 200 for reply in replies))

    with no_cyclic_gc():
        (rollout,) = await agl.arun(agent, [{"id": 1}], llm=server.llm())
    assert timeline(rollout) == [("llm", None, "ok")] * 4
    assert len(rollout.llm_calls) == len(server.requests) == 4
    for call in rollout.llm_calls[:3]:
        model.assert_server_token_ids(call)
    assert rollout.llm_calls[3].output["finish_reason"] == "incomplete_stream"
