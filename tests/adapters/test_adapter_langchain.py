"""LangChain adapter: real LCEL pipelines and ChatOpenAI against the mock server, through ``@agl.rollout``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from adapter_support import timeline
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import Runnable, RunnableLambda, RunnableParallel
from langchain_core.tools import ToolException, tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel

import agentlightning as agl
from agentlightning.testing import MockReply, MockRequest, MockToolCall


def sql_rule(request: MockRequest) -> MockReply:
    """writer -> 'SELECT ...', checker -> 'OK: ...', rewriter -> 'FINAL ...' (by the prompt's first word)."""
    text = request.last_user_text
    if text.startswith("Write"):
        return MockReply(content=f"SELECT * FROM t -- {text[6:]}")
    if text.startswith("Check"):
        return MockReply(content=f"OK: {text[6:]}")
    return MockReply(content=f"FINAL {text}")


def pipeline(llm: ChatOpenAI) -> Runnable:
    """Writer, checker and rewriter steps sharing one model, named the three ways the adapter reads."""
    writer = (ChatPromptTemplate.from_messages([("user", "Write {question}")]) | llm | StrOutputParser()).with_config(
        run_name="writer"
    )
    checker = (ChatPromptTemplate.from_messages([("user", "Check {sql}")]) | llm | StrOutputParser()).with_config(
        tags=["agl_role:checker"]
    )
    rewriter = (
        ChatPromptTemplate.from_messages([("user", "Rewrite {check}")])
        | llm.with_config(metadata={"agl_role": "rewriter"})
        | StrOutputParser()
    )
    return (
        writer
        | RunnableLambda(lambda sql: {"sql": sql})
        | checker
        | RunnableLambda(lambda check: {"check": check})
        | rewriter
    )


def chat_model(llm: agl.LLM, **options: object) -> ChatOpenAI:
    return ChatOpenAI(base_url=llm.base_url, api_key=llm.api_key, model=llm.model, **options)


LLM_PIPELINE = [("llm", "writer", "ok"), ("llm", "checker", "ok"), ("llm", "rewriter", "ok")]


def test_three_roles_sharing_one_model_sync(serve) -> None:
    server, model = serve(sql_rule)

    @agl.rollout(reward=lambda task, out: float(out.startswith("FINAL")))
    def sql_agent(task: dict, llm: agl.LLM) -> str:
        return pipeline(chat_model(llm)).invoke({"question": task["question"]})

    rollout = sql_agent.execute({"question": "how many"}, server.llm())
    assert timeline(rollout) == LLM_PIPELINE
    assert rollout.final_reward == 1.0
    assert rollout.llm_calls[0].input[-1]["content"] == "Write how many"
    for call in rollout.llm_calls:
        model.assert_server_token_ids(call)


async def test_three_roles_async_and_streaming(serve) -> None:
    server, model = serve(sql_rule)

    @agl.rollout
    async def sql_agent(task: dict, llm: agl.LLM) -> float:
        chain = pipeline(chat_model(llm))
        await chain.ainvoke({"question": task["question"]})
        chunks = [chunk async for chunk in pipeline(chat_model(llm, streaming=True)).astream({"question": "again"})]
        return float(bool(chunks))

    rollout = await sql_agent.aexecute({"question": "q"}, server.llm())
    assert timeline(rollout) == LLM_PIPELINE + LLM_PIPELINE
    assert [call.metadata.get("stream", False) for call in rollout.llm_calls] == [False] * 3 + [True] * 3
    for call in rollout.llm_calls:
        model.assert_server_token_ids(call)


@pytest.mark.parametrize("responses_api", [False, True])
def test_sync_invoke_and_stream(serve, responses_api: bool) -> None:
    server, model = serve(sql_rule)

    @agl.rollout
    def sql_agent(task: dict, llm: agl.LLM) -> float:
        chain = pipeline(chat_model(llm, use_responses_api=responses_api))
        chain.invoke({"question": task["question"]})
        return float(len(list(chain.stream({"question": task["question"]}))) > 0)

    rollout = sql_agent.execute({"question": "q"}, server.llm())
    assert timeline(rollout) == LLM_PIPELINE + LLM_PIPELINE
    api = "responses" if responses_api else "chat.completions"
    assert [(call.metadata["api"], call.metadata.get("stream", False)) for call in rollout.llm_calls] == [
        (api, False)
    ] * 3 + [(api, True)] * 3
    for call in rollout.llm_calls:
        model.assert_server_token_ids(call)


def test_graph_style_node_functions_and_parallel_branches(serve) -> None:
    """LangGraph-style nodes (functions named writer/checker/rewriter calling one model) and a RunnableParallel
    whose two named branches run in threads."""
    server, model = serve(sql_rule)

    @agl.rollout
    def agent(task: dict, llm: agl.LLM) -> float:
        chat = chat_model(llm)

        def writer(state: dict) -> dict:
            return {**state, "sql": chat.invoke(f"Write {state['question']}").content}

        def checker(state: dict) -> dict:
            return {**state, "check": chat.invoke(f"Check {state['sql']}").content}

        def rewriter(state: dict) -> dict:
            return {**state, "final": chat.invoke(f"Rewrite {state['check']}").content}

        graph = RunnableLambda(writer) | RunnableLambda(checker) | RunnableLambda(rewriter)
        state = graph.invoke({"question": task["question"]})
        branches = RunnableParallel(
            left=(ChatPromptTemplate.from_messages([("user", "Check {final}")]) | chat).with_config(run_name="left"),
            right=(ChatPromptTemplate.from_messages([("user", "Write {final}")]) | chat).with_config(run_name="right"),
        )
        branches.invoke(state)
        return 1.0

    rollout = agent.execute({"question": "q"}, server.llm())
    calls = timeline(rollout)
    assert calls[:3] == LLM_PIPELINE
    assert sorted(calls[3:]) == [("llm", "left", "ok"), ("llm", "right", "ok")]
    for call in rollout.llm_calls:
        expected = {"left": "Check", "right": "Write"}.get(call.role)
        assert expected is None or call.input[-1]["content"].startswith(expected)
        model.assert_server_token_ids(call)


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def lookup(table: str) -> str:
    """Look a table up (there are none)."""
    raise ToolException(f"no table {table}")


lookup.handle_tool_error = True


@tool
def crash(x: int) -> int:
    """Always raises an unhandled error."""
    raise RuntimeError("disk on fire")


def tool_rule(request: MockRequest) -> MockReply:
    if request.messages[-1]["role"] == "tool":
        results = [m["content"] for m in request.messages if m["role"] == "tool"]
        return MockReply(content="answer: " + " | ".join(results))
    return MockReply(
        tool_calls=[
            MockToolCall(name="add", arguments={"a": 2, "b": 3}),
            MockToolCall(name="lookup", arguments={"table": "users"}),
            MockToolCall(name="crash", arguments={"x": 1}),
        ]
    )


def run_tool_loop(llm: ChatOpenAI, question: str) -> str:
    """The usual hand-written LangChain tool loop: bind tools, run what the model asks for, ask again."""
    tools = {t.name: t for t in (add, lookup, crash)}
    bound = llm.bind_tools(list(tools.values())).with_config(run_name="solver")
    messages: list = [HumanMessage(question)]
    reply = bound.invoke(messages)
    messages.append(reply)
    for request in reply.tool_calls:
        try:
            messages.append(tools[request["name"]].invoke(request))
        except RuntimeError as exc:
            messages.append(ToolMessage(f"error: {exc}", tool_call_id=request["id"], status="error"))
    return bound.invoke(messages).content


def test_tool_calls_succeed_and_fail_with_parent(serve) -> None:
    server, model = serve(tool_rule)

    @agl.rollout(reward=lambda task, out: float("5" in out))
    def agent(task: dict, llm: agl.LLM) -> str:
        return run_tool_loop(chat_model(llm), task["question"])

    rollout = agent.execute({"question": "2+3?"}, server.llm())
    assert timeline(rollout) == [
        ("llm", "solver", "ok"),
        ("tool", "solver:add", "ok"),
        ("tool", "solver:lookup", "error"),
        ("tool", "solver:crash", "error"),
        ("llm", "solver", "ok"),
    ]
    first, add_call, lookup_call, crash_call, _ = rollout.calls
    assert add_call.input == {"a": 2, "b": 3} and add_call.output == "5"
    assert lookup_call.error == "ToolException: no table users"
    assert crash_call.error == "RuntimeError: disk on fire"
    requested = {tc["id"] for tc in first.output["tool_calls"]}
    for tool_call in (add_call, lookup_call, crash_call):
        assert tool_call.parent_call_id == first.call_id
        assert tool_call.metadata["tool_call_id"] in requested
    assert rollout.final_reward == 1.0
    for call in rollout.llm_calls:
        model.assert_server_token_ids(call)


class Verdict(BaseModel):
    correct: bool
    reason: str


def verdict_rule(request: MockRequest) -> MockReply:
    payload = json.dumps({"correct": True, "reason": request.last_user_text})
    if request.tools:  # method="function_calling": the answer comes back as a tool call
        return MockReply(tool_calls=[MockToolCall(name="Verdict", arguments=payload)])
    return MockReply(content=payload)


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_with_structured_output_keeps_token_ids(serve, method: str) -> None:
    server, model = serve(verdict_rule)

    @agl.rollout(reward=lambda task, out: float(out.correct))
    def judge(task: dict, llm: agl.LLM) -> Verdict:
        structured = chat_model(llm).with_structured_output(Verdict, method=method)
        return structured.with_config(run_name="judge").invoke(task["claim"])

    rollout = judge.execute({"claim": "1+1=2"}, server.llm())
    assert timeline(rollout) == [("llm", "judge", "ok")]
    assert rollout.final_reward == 1.0
    model.assert_server_token_ids(rollout.llm_calls[0])


def test_role_precedence_agl_role_step_names_model_name(serve) -> None:
    server, _ = serve(sql_rule)

    @agl.rollout
    def agent(task: dict, llm: agl.LLM) -> float:
        model = chat_model(llm)

        def review(text: str) -> str:
            with agl.role("reviewer"):
                return model.invoke(text).content

        RunnableLambda(review).with_config(run_name="outer_step").invoke("Check a")
        (ChatPromptTemplate.from_messages([("user", "{x}")]) | model).invoke({"x": "Check b"})
        with agl.role("planner"):
            pipeline(model).invoke({"question": "c"})
        judge = chat_model(llm, name="judge")  # a model's own name: the role when nothing else names one
        judge.invoke("Check d")
        pipeline(judge).invoke({"question": "e"})
        return 1.0

    rollout = agent.execute({}, server.llm())
    assert timeline(rollout) == [
        ("llm", "reviewer", "ok"),
        ("llm", None, "ok"),
        *LLM_PIPELINE,
        ("llm", "judge", "ok"),
        *LLM_PIPELINE,
    ]


def test_model_error_keeps_role_and_status(serve) -> None:
    server, _ = serve(lambda request: MockReply(status=500, error_message="overloaded"))

    @agl.rollout
    def agent(task: dict, llm: agl.LLM) -> float:
        chat_model(llm, max_retries=0).with_config(run_name="writer").invoke("hi")
        return 1.0

    rollout = agent.execute({}, server.llm())
    assert rollout.status == "failed"
    assert [(call.role, call.status) for call in rollout.calls] == [("writer", "error")]


def test_role_globs_and_diagnostics(serve) -> None:
    server, _ = serve(sql_rule)

    @agl.rollout(roles=["sql_*", "writer"])
    def agent(task: dict, llm: agl.LLM) -> float:
        pipeline(chat_model(llm)).invoke({"question": "x"})
        return 1.0

    rollout = agent.execute({}, server.llm())
    assert any("sql_*" in note and "rewriter" in note for note in rollout.diagnostics), rollout.diagnostics


@pytest.mark.parametrize("mode", ["threads", "asyncio"])
def test_twenty_parallel_rollouts_do_not_mix(serve, mode: str) -> None:
    server, model = serve(sql_rule)

    def score(task: dict, out: str) -> float:
        return float(task["question"] in out)

    @agl.rollout(reward=score)
    def sync_agent(task: dict, llm: agl.LLM) -> str:
        return pipeline(chat_model(llm)).invoke({"question": task["question"]})

    @agl.rollout(reward=score)
    async def async_agent(task: dict, llm: agl.LLM) -> str:
        return await pipeline(chat_model(llm, streaming=True)).ainvoke({"question": task["question"]})

    tasks = [{"question": f"question number {i}"} for i in range(20)]
    agent = sync_agent if mode == "threads" else async_agent
    rollouts = agl.run(agent, tasks, llm=server.llm(), n_workers=20)
    for task, rollout in zip(tasks, rollouts, strict=True):
        assert timeline(rollout) == LLM_PIPELINE
        assert rollout.final_reward == 1.0
        for call in rollout.llm_calls:
            assert task["question"] in call.input[-1]["content"]
            model.assert_server_token_ids(call)


def test_install_twice_and_uninstall(serve) -> None:
    from agentlightning.adapters import langchain as adapter
    from langchain_core.tracers import context as tracer_context

    server, _ = serve(sql_rule)
    agl.instrument("langchain")
    agl.instrument("langchain")
    hooks = [entry for entry in tracer_context._configure_hooks if entry[0].name == "agl_langchain_handler"]
    assert len(hooks) == 1

    @agl.rollout
    def agent(task: dict, llm: agl.LLM) -> float:
        pipeline(chat_model(llm)).invoke({"question": "x"})
        return 1.0

    try:
        agl.uninstrument("langchain")
        assert adapter.installed_handler() is None
        assert not [entry for entry in tracer_context._configure_hooks if entry[0].name == "agl_langchain_handler"]
        rollout = agent.execute({}, server.llm())
        assert [call.role for call in rollout.llm_calls] == [None, None, None]
    finally:
        agl.instrument("langchain")
    rollout = agent.execute({}, server.llm())
    assert timeline(rollout) == LLM_PIPELINE
    assert not adapter.installed_handler()._runs  # the run tree is emptied as runs end


AGENT_IMPORTING_LANGCHAIN = """
import sys
import agentlightning as agl
from agentlightning.testing import MockLLMServer

@agl.rollout
def agent(task, llm):
    from langchain_openai import ChatOpenAI  # first imported here, while the rollout runs

    model = ChatOpenAI(base_url=llm.base_url, api_key=llm.api_key, model=llm.model)
    model.with_config(run_name="writer").invoke("hi")
    return 1.0

assert "langchain_core" not in sys.modules
with MockLLMServer(token_ids=True) as server:
    rollout = agent.execute({}, server.llm())
print([(call.role, bool(call.completion_token_ids)) for call in rollout.llm_calls])
"""


def test_langchain_imported_inside_a_running_agent_is_instrumented() -> None:
    result = subprocess.run(
        [sys.executable, "-c", AGENT_IMPORTING_LANGCHAIN], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[('writer', True)]"


def test_completion_model_and_retriever_runs_name_roles(serve) -> None:
    # `OpenAI` (legacy completions) reports through on_llm_start; a retriever is a named node of the run tree too.
    from langchain_core.callbacks import CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever
    from langchain_openai import OpenAI

    server, model = serve(sql_rule)

    class QueryRewriter(BaseRetriever):
        """Rewrites the query with a chat model before looking it up."""

        chat: ChatOpenAI

        def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
            rewritten = self.chat.invoke(f"Rewrite {query}", config={"callbacks": run_manager.get_child()}).content
            return [Document(page_content=rewritten)]

    @agl.rollout
    def agent(task: dict, llm: agl.LLM) -> float:
        completer = OpenAI(base_url=llm.base_url, api_key=llm.api_key, model=llm.model, max_retries=0)
        (ChatPromptTemplate.from_template("Write {q}") | completer).with_config(run_name="drafter").invoke({"q": "a"})
        documents = QueryRewriter(chat=chat_model(llm)).invoke("b")
        return float(documents[0].page_content.startswith("FINAL"))

    rollout = agent.execute({}, server.llm())
    assert timeline(rollout) == [("llm", "drafter", "ok"), ("llm", "QueryRewriter", "ok")]
    assert [call.metadata["api"] for call in rollout.llm_calls] == ["completions", "chat.completions"]
    assert rollout.final_reward == 1.0


def test_framework_class_names_are_relisted_when_a_module_is_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    from agentlightning.adapters.langchain import AgentLightningCallbackHandler

    handler = AgentLightningCallbackHandler()
    assert handler._is_generic("RunnableSequence") and not handler._is_generic("LateRunnable")
    for index in range(1000):  # unique user names are neither cached nor costly
        assert not handler._is_generic(f"step-{index}")
    module = types.ModuleType("langchain_late_plugin")  # a LangChain package imported after the first lookups
    late = type("LateRunnable", (RunnableLambda,), {"__module__": module.__name__})
    monkeypatch.setitem(sys.modules, module.__name__, module)
    assert handler._is_generic("LateRunnable") and handler._is_generic("LateRunnable<a,b>")
    del late
