"""DSPy adapter: programs written as DSPy's docs write them (``dspy.Predict`` / ``dspy.ChainOfThought`` signatures, a
``dspy.Module`` with two predictors, ``dspy.ReAct`` with a tool that raises, ``acall``, ``batch`` and
``dspy.Parallel``) on ``dspy.LM("openai/...")`` against the mock server, through ``@agl.rollout``: one captured call
per request served, with the server's token ids and the predictor's name as role, and ReAct's tools recorded."""

from __future__ import annotations

import asyncio
import os
import re
import uuid

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # DSPy and LiteLLM would fetch a price list otherwise
dspy = pytest.importorskip("dspy")

from adapter_support import RecordingModel, timeline  # noqa: E402

import agentlightning as agl  # noqa: E402
from agentlightning.protocol import ROLE_HEADER  # noqa: E402
from agentlightning.testing import MockLLMServer, MockReply, MockRequest  # noqa: E402


@pytest.fixture(autouse=True)
def instrumented() -> None:
    agl.instrument("dspy")


def configured(llm: agl.LLM, **options):
    """The rollout's LM for the modules run inside (no cache, as for training). ``dspy.context``, as DSPy's docs
    advise for threads and async tasks: ``dspy.configure`` may only be called by the thread that called it first."""
    lm = dspy.LM(f"openai/{llm.model}", api_base=llm.base_url, api_key=llm.api_key, cache=False, **options)
    return dspy.context(lm=lm)


def output_fields(request: MockRequest) -> list[str]:
    """The fields DSPy's ChatAdapter asks for, from its system message."""
    system = str(request.messages[0]["content"])
    asked = system.split("Your output fields are:", 1)[1].split("All interactions", 1)[0]
    return re.findall(r"^\d+\. `(\w+)`", asked, flags=re.MULTILINE)


def answer(**fields: object) -> MockReply:
    """A reply in ChatAdapter's format."""
    return MockReply(
        "".join(f"[[ ## {name} ## ]]\n{value}\n\n" for name, value in fields.items()) + "[[ ## completed ## ]]"
    )


def qa_rule(request: MockRequest) -> MockReply:
    """Answers a question-answering signature: a query, then an answer, each with its reasoning when asked."""
    fields = output_fields(request)
    reasoning = {"reasoning": "Let me think."} if "reasoning" in fields else {}
    if "query" in fields:
        return answer(**reasoning, query="capital of France")
    return answer(**reasoning, answer="Paris")


def assert_served_exactly(rollout: agl.Rollout, server: MockLLMServer, model: RecordingModel) -> None:
    """One captured LLM call per request served, each with the server's token ids and the role it was sent with."""
    assert len(rollout.llm_calls) == len(server.requests)
    assert sorted(str(request.headers.get(ROLE_HEADER.lower())) for request in server.requests) == sorted(
        str(call.role) for call in rollout.llm_calls
    )
    for call in rollout.llm_calls:
        model.assert_server_token_ids(call)


def test_predict_and_chain_of_thought_keep_the_role_around_them(serve) -> None:
    server, model = serve(qa_rule)

    @agl.rollout(reward=lambda task, out: float(out == "Paris"))
    def agent(task: dict, llm: agl.LLM) -> str:
        with configured(llm):
            dspy.Predict("question -> answer")(question=task["question"])
            with agl.role("thinker"):
                return dspy.ChainOfThought("question -> answer")(question=task["question"]).answer

    rollout = agent.execute({"question": "What is the capital of France?"}, server.llm())
    assert timeline(rollout) == [("llm", None, "ok"), ("llm", "thinker", "ok")]
    assert rollout.final_reward == 1.0
    assert_served_exactly(rollout, server, model)
    assert rollout.llm_calls[1].output["content"].startswith("[[ ## reasoning ## ]]")


class MultiHop(dspy.Module if dspy else object):  # type: ignore[misc]
    """A module with two predictors, as DSPy's docs write one: a query for a search, then an answer from it."""

    def __init__(self) -> None:
        super().__init__()
        self.generate_query = dspy.ChainOfThought("question -> query")
        self.generate_answer = dspy.Predict("context, question -> answer")

    def forward(self, question: str) -> dspy.Prediction:
        query = self.generate_query(question=question).query
        context = f"Search results for {query}: Paris is the capital of France."
        return self.generate_answer(context=context, question=question)


def test_a_module_names_each_call_after_its_predictor(serve) -> None:
    server, model = serve(qa_rule)

    @agl.rollout(reward=lambda task, out: float(out == "Paris"))
    def agent(task: dict, llm: agl.LLM) -> str:
        with configured(llm):
            return MultiHop()(question=task["question"]).answer

    rollout = agent.execute({"question": "What is the capital of France?"}, server.llm())
    assert timeline(rollout) == [("llm", "generate_query", "ok"), ("llm", "generate_answer", "ok")]
    assert rollout.final_reward == 1.0
    assert_served_exactly(rollout, server, model)


def search_wikipedia(query: str) -> list[str]:
    """Searches Wikipedia for the query and returns the top passages."""
    raise ConnectionError("wikipedia is unreachable")


def evaluate_math(expression: str) -> float:
    """Evaluates a Python arithmetic expression."""
    left, right = expression.split("/")
    return float(left) / float(right)


def react_rule(request: MockRequest) -> MockReply:
    """ReAct: searches (the tool raises), computes, finishes; then the extract step answers."""
    fields = output_fields(request)
    trajectory = str(request.messages[-1]["content"])
    if "next_tool_name" not in fields:
        return answer(reasoning="9362158 / 2 is 4681079.", answer="4681079.0")
    if "observation_0" not in trajectory:
        return answer(next_thought="Look it up.", next_tool_name="search_wikipedia", next_tool_args='{"query": "x"}')
    if "observation_1" not in trajectory:
        return answer(
            next_thought="Compute it.", next_tool_name="evaluate_math", next_tool_args='{"expression": "9362158 / 2"}'
        )
    return answer(next_thought="Done.", next_tool_name="finish", next_tool_args="{}")


REACT_TIMELINE = [
    ("llm", "react", "ok"),
    ("tool", "react:search_wikipedia", "error"),
    ("llm", "react", "ok"),
    ("tool", "react:evaluate_math", "ok"),
    ("llm", "react", "ok"),
    ("tool", "react:finish", "ok"),
    ("llm", "extract", "ok"),
]


def check_react(rollout: agl.Rollout, server: MockLLMServer, model: RecordingModel) -> None:
    assert timeline(rollout) == REACT_TIMELINE
    assert rollout.final_reward == 1.0
    assert_served_exactly(rollout, server, model)
    calls = rollout.calls
    assert calls[1].input == {"query": "x"} and calls[1].error == "ConnectionError: wikipedia is unreachable"
    assert calls[3].input == {"expression": "9362158 / 2"} and calls[3].output == 4681079.0
    for tool_call, asked_by in [(calls[1], calls[0]), (calls[3], calls[2]), (calls[5], calls[4])]:
        assert tool_call.parent_call_id == asked_by.call_id and tool_call.metadata["adapter"] == "dspy"


def test_react_records_its_tools_and_the_one_that_raises(serve) -> None:
    server, model = serve(react_rule)

    @agl.rollout(reward=lambda task, out: float(out == 4681079.0))
    def agent(task: dict, llm: agl.LLM) -> float:
        react = dspy.ReAct("question -> answer: float", tools=[evaluate_math, search_wikipedia])
        with configured(llm):
            return react(question=task["question"]).answer

    check_react(agent.execute({"question": "What is 9362158 divided by 2?"}, server.llm()), server, model)


def test_react_acall(serve) -> None:
    server, model = serve(react_rule)

    @agl.rollout(reward=lambda task, out: float(out == 4681079.0))
    async def agent(task: dict, llm: agl.LLM) -> float:
        react = dspy.ReAct("question -> answer: float", tools=[evaluate_math, search_wikipedia])
        with configured(llm):
            return (await react.acall(question=task["question"])).answer

    rollout = asyncio.run(agent.aexecute({"question": "What is 9362158 divided by 2?"}, server.llm()))
    check_react(rollout, server, model)


def test_batch_and_parallel_capture_every_call_of_their_threads(serve) -> None:
    server, model = serve(qa_rule)
    questions = [f"Question {i}: what is the capital of France?" for i in range(4)]

    @agl.rollout(reward=lambda task, out: float(out == ["Paris"] * 8))
    def agent(task: dict, llm: agl.LLM) -> list[str]:
        program = MultiHop()
        examples = [dspy.Example(question=question).with_inputs("question") for question in task["questions"]]
        with configured(llm):
            batched = program.batch(examples, num_threads=4)
            parallel = dspy.Parallel(num_threads=4)([(program, example) for example in examples])
        return [prediction.answer for prediction in [*batched, *parallel]]

    rollout = agent.execute({"questions": questions}, server.llm())
    assert rollout.status == "succeeded" and rollout.final_reward == 1.0
    assert len(server.requests) == 16
    assert_served_exactly(rollout, server, model)
    roles = [call.role for call in rollout.llm_calls]
    assert roles.count("generate_query") == roles.count("generate_answer") == 8


def test_a_caching_lm_is_warned_about_once(serve, caplog: pytest.LogCaptureFixture) -> None:
    server, model = serve(qa_rule)

    @agl.rollout(reward=lambda task, out: 1.0)
    def agent(task: dict, llm: agl.LLM) -> str:
        with dspy.context(lm=dspy.LM(f"openai/{llm.model}", api_base=llm.base_url, api_key=llm.api_key)):
            return dspy.Predict("question -> answer")(question=task["question"]).answer

    from agentlightning.adapters import dspy as adapter

    adapter._cache_warned.clear()
    with caplog.at_level("WARNING", logger="agentlightning.adapters.dspy"):
        question = f"A question asked twice ({uuid.uuid4().hex})?"  # DSPy's disk cache outlives the test
        first = agent.execute({"question": question}, server.llm())
        second = agent.execute({"question": question}, server.llm())
    warnings = [record.getMessage() for record in caplog.records if "cache=False" in record.getMessage()]
    assert len(warnings) == 1 and "caching LM" in warnings[0]
    assert len(server.requests) == 1  # the second rollout's answer came from DSPy's cache
    assert len(first.llm_calls) == 1 and second.llm_calls == []


def test_engine_litellm_is_captured_once(serve) -> None:
    """``dspy.LM(engine="litellm")`` sends through LiteLLM and the openai client: recorded there, once."""
    server, model = serve(qa_rule)

    @agl.rollout(reward=lambda task, out: float(out == "Paris"))
    def agent(task: dict, llm: agl.LLM) -> str:
        with configured(llm, engine="litellm"):
            return MultiHop()(question=task["question"]).answer

    rollout = agent.execute({"question": "What is the capital of France?"}, server.llm())
    assert timeline(rollout) == [("llm", "generate_query", "ok"), ("llm", "generate_answer", "ok")]
    assert_served_exactly(rollout, server, model)


def test_streamify_with_a_listener_is_captured_with_the_streamed_tokens(serve) -> None:
    """DSPy's streaming guide: ``dspy.streamify`` with a ``StreamListener`` on the output field, read to the end."""
    server, model = serve(qa_rule)

    @agl.rollout(reward=lambda task, out: float(out == "Paris"))
    async def agent(task: dict, llm: agl.LLM) -> str:
        listener = dspy.streaming.StreamListener(signature_field_name="answer")
        program = dspy.streamify(MultiHop(), stream_listeners=[listener])
        chunks, prediction = [], None
        with configured(llm):
            async for chunk in program(question=task["question"]):
                if isinstance(chunk, dspy.streaming.StreamResponse):
                    chunks.append(chunk.chunk)
                elif isinstance(chunk, dspy.Prediction):
                    prediction = chunk
        assert "".join(chunks).strip() == "Paris"
        return prediction.answer

    rollout = asyncio.run(agent.aexecute({"question": "What is the capital of France?"}, server.llm()))
    assert timeline(rollout) == [("llm", "generate_query", "ok"), ("llm", "generate_answer", "ok")]
    # only the predictor whose field the listener reads is streamed
    assert [bool(request.stream) for request in server.requests] == [False, True]
    assert [call.metadata["stream"] for call in rollout.llm_calls] == [False, True]
    assert_served_exactly(rollout, server, model)
