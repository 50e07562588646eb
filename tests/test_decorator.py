"""``@agl.rollout``, ``agl.role`` and ``agl.emit_reward`` as users write them, run against the mock server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading

import openai
import pytest

import agentlightning as agl
from agentlightning._decorator import RolloutAgent
from agentlightning.capture._context import current_role
from agentlightning.testing import MockLLMServer


@pytest.fixture
def llm() -> agl.LLM:
    with MockLLMServer() as server:
        yield server.llm()


def ask(llm: agl.LLM, text: str) -> str:
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    return (
        client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": text}])
        .choices[0]
        .message.content
    )


def test_bare_decorator_keeps_function_callable(llm: agl.LLM) -> None:
    @agl.rollout
    def agent(task: dict, llm: agl.LLM) -> float:
        """Docstring kept."""
        return 0.5 if ask(llm, task["q"]) == f"echo: {task['q']}" else 0.0

    assert isinstance(agent, RolloutAgent) and agent.roles is None and agent.name.endswith("agent")
    assert agent.__doc__ == "Docstring kept." and agent.__name__ == "agent"
    assert agent({"q": "direct"}, llm) == 0.5  # plain call, no capture
    rollout = agent.execute({"q": "hi"}, llm)
    assert rollout.status == "succeeded" and rollout.final_reward == 0.5 and len(rollout.calls) == 1
    assert rollout.rewards[0].source == "final"


def test_options_roles_reward_name(llm: agl.LLM) -> None:
    def score(task: dict, output: str) -> float:
        return 1.0 if output == f"echo: {task['q']}" else 0.0

    @agl.rollout(roles=["writer"], reward=score, name="sql-agent")
    def agent(task: dict, llm: agl.LLM) -> str:
        with agl.role("writer"):
            return ask(llm, task["q"])

    rollout = agent.execute({"q": "x"}, llm)
    assert (agent.name, agent.roles, rollout.trainable_roles) == ("sql-agent", ["writer"], ["writer"])
    assert rollout.final_reward == 1.0 and rollout.output == "echo: x" and rollout.calls[0].role == "writer"


async def test_async_agent_with_rollout_parameter(llm: agl.LLM) -> None:
    @agl.rollout
    async def agent(task: int, llm: agl.LLM, rollout: agl.Rollout) -> float:
        client = openai.AsyncOpenAI(base_url=llm.base_url, api_key="x", max_retries=0)
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": rollout.rollout_id}])
        await client.close()
        return float(task)

    assert agent.is_async
    rollout = await agent.aexecute(3, llm)
    assert rollout.final_reward == 3.0 and rollout.calls[0].input[0]["content"] == rollout.rollout_id


def test_async_agent_through_sync_execute(llm: agl.LLM) -> None:
    @agl.rollout
    async def agent(task: int, llm: agl.LLM) -> float:
        return float(task)

    assert agent.execute(4, llm).final_reward == 4.0


async def test_async_agent_through_sync_execute_inside_a_running_loop(llm: agl.LLM) -> None:
    @agl.rollout
    async def agent(task: int, llm: agl.LLM) -> float:
        client = openai.AsyncOpenAI(base_url=llm.base_url, api_key="x", max_retries=0)
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        await client.close()
        return float(task)

    rollout = agent.execute(5, llm)  # a notebook or server handler calling the sync API
    assert rollout.status == "succeeded" and rollout.final_reward == 5.0
    assert [call.kind for call in rollout.calls] == ["llm"]


def test_role_as_decorator_nested_and_async(llm: agl.LLM) -> None:
    @agl.role("checker")
    def check(llm: agl.LLM) -> str:
        return ask(llm, "check")

    @agl.rollout
    def agent(task: int, llm: agl.LLM) -> None:
        with agl.role("writer"):
            ask(llm, "write")
            check(llm)
            ask(llm, "write again")
        ask(llm, "no role")
        agl.emit_reward(1.0, final=True)

    rollout = agent.execute(1, llm)
    assert [c.role for c in rollout.calls] == ["writer", "checker", "writer", None]
    assert rollout.final_reward == 1.0


def test_emit_reward_attaches_to_latest_llm_call(llm: agl.LLM, caplog: pytest.LogCaptureFixture) -> None:
    @agl.rollout
    def agent(task: int, llm: agl.LLM) -> float:
        agl.emit_reward(0.1, name="early")
        ask(llm, "a")
        agl.emit_reward(0.2)
        return 1.0

    rollout = agent.execute(1, llm)
    early, intermediate, final = rollout.rewards
    assert early.call_id is None and intermediate.call_id == rollout.calls[0].call_id
    assert final.source == "final" and rollout.final_reward == 1.0
    with caplog.at_level(logging.WARNING):
        assert agl.emit_reward(1.0) is None
    assert "outside a rollout" in caplog.text


@pytest.mark.parametrize("bad", [math.nan, math.inf, "0.5", [1.0], True])
def test_bad_returned_reward_fails_rollout_naming_value_and_agent(llm: agl.LLM, bad: object) -> None:
    @agl.rollout(name="scorer")
    def agent(task: dict, llm: agl.LLM) -> object:
        ask(llm, "q")
        return bad

    rollout = agent.execute({"id": "t7"}, llm)
    assert rollout.status == "failed" and len(rollout.calls) == 1
    message = rollout.error.message
    assert "agent 'scorer' on task 't7'" in message and repr(bad) in message


@pytest.mark.parametrize("bad", [math.nan, -math.inf, "high"])
def test_bad_reward_function_value_names_the_function(llm: agl.LLM, bad: object) -> None:
    def judge(task: int, output: str) -> object:
        return bad

    agent = agl.rollout(reward=judge)(lambda task, llm: ask(llm, "q"))
    rollout = agent.execute(1, llm)
    assert (
        rollout.status == "failed"
        and "reward function 'test_bad_reward_function_value_names_the_function" in rollout.error.message
        and "judge" in rollout.error.message
        and repr(bad) in rollout.error.message
    )


@pytest.mark.parametrize("bad", [math.nan, math.inf, "1"])
def test_bad_emitted_reward_raises_naming_value(llm: agl.LLM, bad: object) -> None:
    @agl.rollout
    def agent(task: int, llm: agl.LLM) -> float:
        agl.emit_reward(bad, name="fmt")  # type: ignore[arg-type]
        return 1.0

    rollout = agent.execute(1, llm)
    assert rollout.status == "failed" and rollout.error.type == "ValueError"
    assert "agl.emit_reward(name='fmt')" in rollout.error.message and repr(bad) in rollout.error.message


def test_non_json_task_rejected_naming_agent(llm: agl.LLM) -> None:
    agent = agl.rollout(name="picky")(lambda task, llm: 1.0)
    with pytest.raises(ValueError, match="task for agent 'picky' is not JSON-serialisable"):
        agent.execute({"x": {1, 2}}, llm)


@pytest.mark.parametrize(("roles", "match"), [("writer", "must be a list"), ([""], "must be a list"), ([3], "3")])
def test_bad_roles_option(roles: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        agl.rollout(roles=roles)(lambda task, llm: 1.0)  # type: ignore[arg-type]


def test_bad_signatures_and_role_names() -> None:
    with pytest.raises(TypeError, match="required parameter 'extra'"):
        agl.rollout(lambda task, llm, extra: 1.0)
    with pytest.raises(TypeError, match="must decorate a function, got int"):
        agl.rollout(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-empty string, got ''"):
        agl.role("")


@pytest.mark.parametrize("is_async", [True, False])
async def test_timeout_error_raised_by_the_agent_is_a_failure_not_a_rollout_timeout(
    llm: agl.LLM, is_async: bool
) -> None:
    # socket / asyncio timeouts inside the agent are TimeoutError too; only our own deadline means 'timeout'.
    def work(llm: agl.LLM) -> float:
        ask(llm, "query")
        raise TimeoutError("database lock wait exceeded")

    async def async_agent(task: int, llm: agl.LLM) -> float:
        return work(llm)

    agent = agl.rollout(async_agent if is_async else (lambda task, llm: work(llm)), name="db")
    for timeout in (None, 30.0):
        rollout = await agent.aexecute(1, llm, timeout=timeout)
        assert rollout.status == "failed", rollout.error
        assert rollout.error.type == "TimeoutError" and rollout.error.message == "database lock wait exceeded"
        assert "database lock wait exceeded" in rollout.error.traceback
        assert [call.kind for call in rollout.calls] == ["llm"]


async def test_aexecute_deadline_still_marks_timeout(llm: agl.LLM) -> None:
    @agl.rollout
    async def agent(task: int, llm: agl.LLM) -> float:
        ask(llm, "before the hang")
        await asyncio.sleep(30)
        return 1.0

    rollout = await agent.aexecute(1, llm, timeout=0.2)
    assert rollout.status == "timeout" and rollout.error.type == "Timeout" and "0.2 s" in rollout.error.message
    assert [call.kind for call in rollout.calls] == ["llm"]


async def test_one_role_object_shared_by_concurrent_tasks_restores_each_tasks_role() -> None:
    writer = agl.role("writer")  # a module-level role object, used by parallel rollouts on one event loop
    b_inside = asyncio.Event()
    seen: dict[str, str | None] = {}

    async def first() -> None:
        with agl.role("planner"):
            async with writer:
                await b_inside.wait()  # the other task enters the same object, then this one leaves first
            seen["first after"] = current_role()

    async def second() -> None:
        await asyncio.sleep(0)
        async with writer:
            b_inside.set()
            await asyncio.sleep(0.01)
            seen["second inside"] = current_role()
        seen["second after"] = current_role()

    await asyncio.gather(first(), second())
    assert seen == {"first after": "planner", "second inside": "writer", "second after": None}


def test_one_role_object_shared_by_threads_and_reentered() -> None:
    writer = agl.role("writer")
    both_inside = threading.Barrier(2)
    first_left = threading.Event()
    seen: dict[str, list[str | None]] = {}

    def work(name: str, outer: str | None) -> None:
        with agl.role(outer) if outer else contextlib.nullcontext():
            with writer:
                both_inside.wait()
                with writer:
                    inner = current_role()
                after_inner = current_role()
                if name == "b":
                    first_left.wait(5)  # "a" leaves the shared object while "b" is still inside it
            first_left.set()
            seen[name] = [inner, after_inner, current_role()]

    threads = [threading.Thread(target=work, args=("a", "planner")), threading.Thread(target=work, args=("b", None))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == {"a": ["writer", "writer", "planner"], "b": ["writer", "writer", None]}


class AsyncCallableAgent:
    """An agent object whose ``__call__`` is ``async def``."""

    async def __call__(self, task: int, llm: agl.LLM) -> float:
        client = openai.AsyncOpenAI(base_url=llm.base_url, api_key="x", max_retries=0)
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": str(task)}])
        await client.close()
        return float(task)


def returns_a_coroutine(task: int, llm: agl.LLM) -> object:
    return AsyncCallableAgent()(task, llm)  # a plain function handing back the coroutine of an async one


@pytest.mark.parametrize("func", [AsyncCallableAgent(), returns_a_coroutine])
async def test_awaitable_results_are_awaited_by_execute_and_aexecute(llm: agl.LLM, func: object) -> None:
    agent = agl.rollout(func)
    assert agent.is_async == isinstance(func, AsyncCallableAgent)
    for rollout in (await agent.aexecute(3, llm), agent.execute(4, llm)):
        assert rollout.status == "succeeded", rollout.error
        assert [call.kind for call in rollout.calls] == ["llm"] and rollout.final_reward in (3.0, 4.0)
    assert agl.rollout(AsyncCallableAgent()).name == "AsyncCallableAgent"


def test_keyword_only_rollout_parameter_and_required_extras_named_at_decoration(llm: agl.LLM) -> None:
    @agl.rollout
    def agent(task: int, llm: agl.LLM, *, rollout: agl.Rollout, retries: int = 2) -> float:
        assert rollout.status == "running" and retries == 2
        ask(llm, rollout.rollout_id)
        return float(task)

    rollout = agent.execute(2, llm)
    assert rollout.status == "succeeded" and rollout.calls[0].input[0]["content"] == rollout.rollout_id
    with pytest.raises(TypeError, match="required keyword-only parameter 'retries'"):
        agl.rollout(lambda task, llm, *, retries: 1.0)

    class NeedsMore:
        def __call__(self, task: int, llm: agl.LLM, extra: str) -> float:
            return 1.0

    with pytest.raises(TypeError, match="NeedsMore.* has a required parameter 'extra'"):
        agl.rollout(NeedsMore())
