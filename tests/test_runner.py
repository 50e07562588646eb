"""``agl.run``: order, crashes, hangs, bad tasks and arguments, async agents, diagnostics — against the mock server."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import openai
import pytest

import agentlightning as agl
from agentlightning._attempt import Attempt
from agentlightning.protocol import task_id_for
from agentlightning.testing import MockLLMServer, MockReply, MockRequest


@pytest.fixture
def server() -> Iterator[MockLLMServer]:
    with MockLLMServer() as srv:
        yield srv


def ask(llm: agl.LLM, text: str) -> str:
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    return (
        client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": text}])
        .choices[0]
        .message.content
    )


def test_results_in_task_order_and_plain_function_wrapped(server: MockLLMServer) -> None:
    # Later tasks answer faster, so rollouts finish out of order.
    server.set_handler(lambda r: MockReply(content=r.last_user_text, latency=0.05 * (5 - int(r.last_user_text))))

    def agent(task: dict, llm: agl.LLM) -> float:  # not decorated
        return float(ask(llm, str(task["n"])))

    rollouts = agl.run(agent, [{"n": n} for n in range(5)], llm=server.llm(), n_workers=5)
    assert [r.final_reward for r in rollouts] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert all(r.status == "succeeded" and len(r.calls) == 1 for r in rollouts)
    assert rollouts[0].timings["duration"] > rollouts[4].timings["duration"]


def test_n_workers_limits_concurrency(server: MockLLMServer) -> None:
    lock, state = threading.Lock(), {"now": 0, "max": 0}

    @agl.rollout
    def agent(task: int, llm: agl.LLM) -> float:
        with lock:
            state["now"] += 1
            state["max"] = max(state["max"], state["now"])
        ask(llm, str(task))
        with lock:
            state["now"] -= 1
        return 0.0

    server.set_handler(lambda r: MockReply(content="x", latency=0.02))
    rollouts = agl.run(agent, list(range(8)), llm=server.llm(), n_workers=2)
    assert len(rollouts) == 8 and state["max"] == 2


def test_crash_keeps_calls_and_traceback_others_unaffected(server: MockLLMServer) -> None:
    @agl.rollout
    def agent(task: dict, llm: agl.LLM) -> float:
        ask(llm, task["q"])
        if task["q"] == "boom":
            raise KeyError("missing column")
        return 1.0

    rollouts = agl.run(agent, [{"q": "a"}, {"q": "boom"}, {"q": "c"}], llm=server.llm())
    assert [r.status for r in rollouts] == ["succeeded", "failed", "succeeded"]
    failed = rollouts[1]
    assert failed.error.type == "KeyError" and "missing column" in failed.error.message
    assert 'raise KeyError("missing column")' in failed.error.traceback
    assert len(failed.calls) == 1 and failed.calls[0].output["content"] == "echo: boom"


def test_hung_sync_agent_times_out_keeping_its_calls(server: MockLLMServer) -> None:
    release = threading.Event()

    @agl.rollout
    def agent(task: dict, llm: agl.LLM) -> float:
        ask(llm, f"before-{task['n']}")
        if task["n"] == 1:
            release.wait()  # hangs until the test ends
        return 1.0

    started = time.perf_counter()
    try:
        rollouts = agl.run(agent, [{"n": n} for n in range(3)], llm=server.llm(), n_workers=3, timeout=1.0)
    finally:
        release.set()
    assert time.perf_counter() - started < 4
    assert [r.status for r in rollouts] == ["succeeded", "timeout", "succeeded"]
    hung = rollouts[1]
    assert hung.error.type == "Timeout" and "1.0 s" in hung.error.message
    assert [c.input[-1]["content"] for c in hung.calls] == ["before-1"]


def test_hung_llm_call_times_out(server: MockLLMServer) -> None:
    server.set_handler(lambda r: MockReply(hang=r.last_user_text == "hang", content="ok"))

    @agl.rollout
    def agent(task: str, llm: agl.LLM) -> float:
        ask(llm, "first")
        ask(llm, task)
        return 1.0

    rollouts = agl.run(agent, ["fine", "hang"], llm=server.llm(), timeout=1.0)
    assert [r.status for r in rollouts] == ["succeeded", "timeout"]
    assert len(rollouts[1].calls) == 1  # the finished call is kept; the hanging one never completed


def test_hung_async_agent_is_cancelled(server: MockLLMServer) -> None:
    cancelled = []

    @agl.rollout
    async def agent(task: dict, llm: agl.LLM) -> float:
        client = openai.AsyncOpenAI(base_url=llm.base_url, api_key="x", max_retries=0)
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": str(task["n"])}])
        if task["n"] == 0:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append(task["n"])
                raise
        return 2.0

    rollouts = agl.run(agent, [{"n": 0}, {"n": 1}], llm=server.llm(), timeout=1.0)
    assert [r.status for r in rollouts] == ["timeout", "succeeded"]
    assert len(rollouts[0].calls) == 1 and cancelled == [0]


def test_api_errors_recorded_and_rollouts_finish(server: MockLLMServer) -> None:
    server.set_handler(
        lambda r: (
            MockReply(status=429 if "limit" in r.last_user_text else 500, error_message="nope")
            if r.last_user_text != "ok"
            else MockReply(content="fine")
        )
    )

    @agl.rollout
    def agent(task: str, llm: agl.LLM) -> float:
        try:
            ask(llm, task)
        except openai.RateLimitError:
            return 0.0  # the agent handles rate limits itself
        ask(llm, "ok")
        return 1.0

    limited, crashed = agl.run(agent, ["limit", "server"], llm=server.llm())
    assert limited.status == "succeeded" and limited.final_reward == 0.0
    assert limited.calls[0].status == "error" and limited.calls[0].metadata["http_status"] == 429
    assert crashed.status == "failed" and crashed.error.type == "InternalServerError"
    assert crashed.calls[0].status == "error" and "nope" in crashed.calls[0].error
    assert any("all 1 LLM calls failed" in note for note in crashed.diagnostics)


def test_non_json_task_fails_alone_naming_its_index(server: MockLLMServer) -> None:
    @agl.rollout
    def agent(task: object, llm: agl.LLM) -> float:
        ask(llm, "x")
        return 1.0

    rollouts = agl.run(agent, [{"a": 1}, {"when": object()}, [1, 2]], llm=server.llm())
    assert [r.status for r in rollouts] == ["succeeded", "failed", "succeeded"]
    assert "task #1" in rollouts[1].error.message and "not JSON-serialisable" in rollouts[1].error.message
    assert rollouts[1].calls == []
    rollouts[1].model_dump_json()  # still a storable record


def test_async_agent_with_bad_task(server: MockLLMServer) -> None:
    @agl.rollout
    async def agent(task: object, llm: agl.LLM) -> float:
        return 1.0

    rollouts = agl.run(agent, [1, {2, 3}], llm=server.llm())
    assert [r.status for r in rollouts] == ["succeeded", "failed"] and "task #1" in rollouts[1].error.message


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"tasks": {"q": 1}}, TypeError, "must be a list of tasks, got dict"),
        ({"tasks": "abc"}, TypeError, "wrap a single task in a list"),
        ({"tasks": 5}, TypeError, "must be a list of tasks, got int 5"),
        ({"n_workers": 0}, ValueError, "n_workers=...) must be an integer >= 1, got 0"),
        ({"timeout": -1}, ValueError, "timeout=...) must be a positive number"),
        ({"llm": "http://x"}, TypeError, "must be an agl.LLM"),
        ({"llm": {"model": "m"}}, ValueError, "not a valid agl.LLM"),
        ({"agent": 3}, TypeError, "must be an @agl.rollout function or a callable, got 3"),
    ],
)
def test_bad_arguments_named(kwargs: dict, error: type, message: str) -> None:
    arguments = {"agent": lambda task, llm: 1.0, "tasks": [1], "llm": agl.LLM(base_url="http://x/v1", model="m")}
    arguments.update(kwargs)
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        agl.run(arguments.pop("agent"), arguments.pop("tasks"), **arguments)


def test_llm_as_dict_and_rollout_parameter(server: MockLLMServer) -> None:
    @agl.rollout
    def agent(task: int, llm: agl.LLM, rollout: agl.Rollout) -> float:
        assert rollout.task == task and rollout.status == "running"
        return float(task)

    (rollout,) = agl.run(agent, [7], llm={"base_url": server.base_url, "model": "m", "model_version": "v3"})
    assert rollout.final_reward == 7.0 and rollout.model_version == "v3"


async def test_run_inside_event_loop_and_arun(server: MockLLMServer) -> None:
    @agl.rollout
    async def agent(task: int, llm: agl.LLM) -> float:
        return float(task)

    def sync_agent(task: int, llm: agl.LLM) -> float:
        return float(task) * 2

    assert [r.final_reward for r in agl.run(agent, [1, 2], llm=server.llm())] == [1.0, 2.0]
    assert [r.final_reward for r in await agl.arun(agent, [3], llm=server.llm())] == [3.0]
    assert [r.final_reward for r in await agl.arun(sync_agent, [4], llm=server.llm())] == [8.0]


def test_task_ids() -> None:
    assert task_id_for({"id": 12, "q": "x"}) == "12" and task_id_for({"task_id": "t1"}) == "t1"
    assert task_id_for({"q": "x", "a": 1}) == task_id_for({"a": 1, "q": "x"}) != task_id_for({"q": "y"})


# -- diagnostics ---------------------------------------------------------------------------------------------------


def test_empty_rollout_explains_endpoint_and_patch(server: MockLLMServer) -> None:
    @agl.rollout
    def agent(task: int, llm: agl.LLM) -> float:
        return 1.0

    (rollout,) = agl.run(agent, [1], llm=server.llm())
    (note,) = rollout.diagnostics
    assert "no LLM call was captured" in note and "The openai client is patched" in note
    assert f"llm.base_url={server.base_url}" in note


def test_stream_never_consumed_is_explained(server: MockLLMServer) -> None:
    @agl.rollout
    def agent(task: int, llm: agl.LLM) -> float:
        client = openai.OpenAI(base_url=llm.base_url, api_key="x", max_retries=0)
        client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": "hi"}], stream=True)
        return 1.0  # the stream is never read

    (rollout,) = agl.run(agent, [1], llm=server.llm())
    (note,) = rollout.diagnostics
    assert "no LLM call was captured" in note
    assert f"Calls to {server.base_url} started but never finished" in note


def test_call_from_thread_without_context_is_explained(server: MockLLMServer) -> None:
    with MockLLMServer() as other:

        @agl.rollout
        def agent(task: int, llm: agl.LLM) -> float:
            thread = threading.Thread(target=ask, args=(other.llm(), "lost"))  # context not copied
            thread.start()
            thread.join()
            return 1.0

        (rollout,) = agl.run(agent, [1], llm=server.llm())
    (note,) = rollout.diagnostics
    assert "outside its context" in note and f"last one to {other.base_url}" in note
    assert f"differs from llm.base_url={server.base_url}" in note and "copy_context" in note


def test_role_filter_diagnostics(server: MockLLMServer) -> None:
    @agl.rollout(roles=["writer", "critic*"])
    def agent(task: str, llm: agl.LLM) -> float:
        with agl.role(task):
            ask(llm, "x")
        ask(llm, "unnamed")
        return 1.0

    planner, writer = agl.run(agent, ["planner", "writer"], llm=server.llm())
    assert any(
        "selected none of the 2 LLM calls" in n and "['planner']" in n and "1 calls had no role" in n
        for n in planner.diagnostics
    )
    assert any(
        "roles ['critic*'] never appeared" in n and "context only: ['<no role>']" in n for n in writer.diagnostics
    )


def test_missing_reward_diagnostic(server: MockLLMServer) -> None:
    (rollout,) = agl.run(lambda task, llm: ask(llm, "q") and None, [1], llm=server.llm())
    assert rollout.final_reward is None and any("no final reward" in n for n in rollout.diagnostics)


def test_unpatched_client_is_explained(server: MockLLMServer) -> None:
    http = openai.DefaultHttpxClient.__mro__[1].__module__.partition(".")[0]  # httpx2 under openai 3, httpx under 2
    agl.uninstrument("openai")
    try:
        (rollout,) = agl.run(lambda task, llm: ask(llm, "q") and 1.0, [1], llm=server.llm())
        assert len(rollout.calls) == 1  # the HTTP layer's adapter still records the client's request
        agl.uninstrument(http)
        (rollout,) = agl.run(lambda task, llm: ask(llm, "q") and 1.0, [1], llm=server.llm())
    finally:
        agl.instrument("openai")
        agl.instrument(http)
    assert rollout.calls == [] and "NOT patched" in rollout.diagnostics[0]


def test_handler_sees_request(server: MockLLMServer) -> None:
    seen: list[MockRequest] = []
    server.set_handler(lambda r: seen.append(r) or MockReply(content="ok"))
    agl.run(lambda task, llm: ask(llm, task) and 1.0, ["hello"], llm=server.llm())
    assert seen[0].last_user_text == "hello"


def test_run_level_warnings_for_empty_capture_and_unused_roles(
    server: MockLLMServer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger="agentlightning._run"):
        agl.run(lambda task, llm: 1.0, [1, 2], llm=server.llm())
    assert "none of the 2 rollouts" in caplog.text and "captured an LLM call" in caplog.text
    caplog.clear()

    @agl.rollout(roles=["writer", "judge"])
    def agent(task: int, llm: agl.LLM) -> float:
        with agl.role("writer"):
            ask(llm, "x")
        return 1.0

    with caplog.at_level("WARNING", logger="agentlightning._run"):
        agl.run(agent, [1, 2], llm=server.llm())
    assert "roles ['judge']" in caplog.text and "matched no LLM call in any of the 2 rollouts" in caplog.text
    assert "['writer']" in caplog.text


def test_callable_object_with_async_call(server: MockLLMServer) -> None:
    class Agent:
        async def __call__(self, task: int, llm: agl.LLM) -> float:
            client = openai.AsyncOpenAI(base_url=llm.base_url, api_key="x", max_retries=0)
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": str(task)}])
            await client.close()
            return float(task)

    rollouts = agl.run(Agent(), [1, 2], llm=server.llm())
    assert [r.final_reward for r in rollouts] == [1.0, 2.0] and all(len(r.calls) == 1 for r in rollouts)


def test_slow_reward_function_after_deadline_does_not_spin_or_lose_the_rollout(server: MockLLMServer) -> None:
    def slow_score(task: int, output: str) -> float:
        time.sleep(0.6)  # finishing starts before the deadline and ends after it
        return 1.0

    agent = agl.rollout(reward=slow_score)(lambda task, llm: ask(llm, "q"))
    started = time.process_time()
    (rollout,) = agl.run(agent, [1], llm=server.llm(), timeout=0.3)
    assert rollout.status == "succeeded" and rollout.final_reward == 1.0
    assert time.process_time() - started < 0.2  # waited (a busy loop burns ~0.3 s of CPU here)


async def _async_agent(task: str, llm: agl.LLM) -> float:
    return 1.0


@pytest.mark.parametrize("function", [lambda task, llm: 1.0, _async_agent], ids=["sync", "async"])
def test_rollout_that_cannot_start_fails_alone(
    server: MockLLMServer, monkeypatch: pytest.MonkeyPatch, function: object
) -> None:
    agent = agl.rollout(function)
    real_start = Attempt.start

    def start(attempt: Attempt) -> None:
        if attempt.task == "bad":
            raise RuntimeError("recorder unavailable")
        real_start(attempt)

    monkeypatch.setattr(Attempt, "start", start)
    rollouts = agl.run(agent, ["ok", "bad", "ok"], llm=server.llm())
    assert [r.status for r in rollouts] == ["succeeded", "failed", "succeeded"]
    assert "task #1" in rollouts[1].error.message and "recorder unavailable" in rollouts[1].error.message
