"""The Responses API on the per-rollout proxy in front of a chat-only backend (``translate_responses=True``), driven
by the real ``openai`` SDK: translated to the upstream's chat completions and back, streamed as Responses events,
recorded as chat calls with the upstream's token ids; ``previous_response_id`` continues a response of the rollout."""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from agentlightning._cli import add_server_arguments, server_from_args
from agentlightning._uvicorn import BackgroundServer
from agentlightning._wire import anthropic as agentlightning_anthropic
from agentlightning._wire import responses
from agentlightning.server import LightningServer, Settings
from agentlightning.testing import MockLLMServer, MockReply, MockToolCall
from agentlightning.types import Rollout

ADD = {
    "type": "function",
    "name": "add",
    "description": "Add two numbers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}},
}


@pytest.fixture
def mock() -> Iterator[MockLLMServer]:
    with MockLLMServer() as server:
        yield server


@pytest.fixture
def server(tmp_path: Path, mock: MockLLMServer) -> Iterator[LightningServer]:
    settings = Settings(retry_backoff=0.01, retry_backoff_max=0.05, upstream_retry_window=1.0)
    with LightningServer(
        tmp_path / "store.db",
        upstream_url=mock.base_url,
        model_name="mock-model",
        model_version="v2",
        translate_responses=True,
        settings=settings,
    ) as srv:
        yield srv


def _running(server: LightningServer) -> tuple[str, openai.OpenAI]:
    [rid] = server.enqueue([{"q": "x"}])
    lease = server.store.dequeue("test-worker", 30.0)
    assert lease.rollout_id == rid
    return rid, openai.OpenAI(base_url=f"{server.url}/rollouts/{rid}/v1", api_key="unused", max_retries=0)


def _finish(server: LightningServer, rid: str) -> Rollout:
    result = Rollout(rollout_id=rid, status="succeeded", final_reward=1.0)
    response = httpx.post(
        f"{server.url}/rollouts/{rid}/result",
        json={"attempt": 1, "worker_id": "test-worker", "rollout": result.model_dump(mode="json")},
    )
    assert response.status_code == 200, response.text
    [done] = server.wait([rid], timeout=5)
    return done


@pytest.mark.parametrize("stream", [False, True])
def test_tool_loop_translated_to_chat(server: LightningServer, mock: MockLLMServer, stream: bool) -> None:
    mock.set_replies([MockReply(tool_calls=[MockToolCall(name="add", arguments={"a": 2, "b": 3})]), "It is 5."])
    rid, client = _running(server)
    items: list = [{"role": "developer", "content": "Use the tool."}, {"role": "user", "content": "2+3?"}]
    answers = []
    for _ in range(2):  # the loop as OpenAI's function-calling guide writes it: the whole input each turn
        if stream:
            events = list(client.responses.create(model="any", input=items, tools=[ADD], stream=True))
            assert events[0].type == "response.created" and events[-1].type == "response.completed"
            answer = events[-1].response
        else:
            answer = client.responses.create(model="any", input=items, tools=[ADD], instructions="Be terse.")
        answers.append(answer)
        calls = [item for item in answer.output if item.type == "function_call"]
        for call in calls:
            items += [call.model_dump(exclude_none=True), {"type": "function_call_output", "call_id": call.call_id}]
            items[-1]["output"] = str(sum(json.loads(call.arguments).values()))
    assert answers[0].output[0].name == "add" and json.loads(answers[0].output[0].arguments) == {"a": 2, "b": 3}
    assert answers[1].output_text == "It is 5." and answers[1].status == "completed"
    assert [request.path for request in mock.requests] == ["/v1/chat/completions"] * 2
    sent = mock.requests[1].body
    assert sent["tools"] == [
        {"type": "function", "function": {k: ADD[k] for k in ("name", "parameters", "description")}}
    ]
    assert [m["role"] for m in sent["messages"]][-4:] == ["system", "user", "assistant", "tool"]  # developer: system
    first, second = _finish(server, rid).calls
    for call in (first, second):
        assert call.metadata["api"] == "responses" and call.metadata["stream"] is stream
        assert call.metadata["endpoint"] == "chat.completions" and call.metadata["model_version"] == "v2"
        assert call.token_source == "server" and call.prompt_token_ids and call.completion_token_ids
    assert first.output["tool_calls"][0]["function"]["name"] == "add"
    assert second.output["content"] == "It is 5." and second.input[-1]["role"] == "tool"
    assert second.input[-1]["content"] == "5"  # the tool's output went back
    assert first.metadata["response_id"] == answers[0].id and second.metadata["response_id"] == answers[1].id


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_round_trip(server: LightningServer, mock: MockLLMServer, stream: bool) -> None:
    """The upstream's reasoning comes back as a ``reasoning`` item before the answer's items, and goes upstream again,
    sent back as Codex does, as the ``reasoning_content`` of the assistant message it preceded."""
    call = MockToolCall(name="add", arguments={"a": 2, "b": 3})
    mock.set_replies([MockReply(reasoning="Use add.", content="Adding.", tool_calls=[call]), "It is 5."])
    rid, client = _running(server)
    items: list = [{"role": "user", "content": "2+3?"}]
    if stream:
        events = list(client.responses.create(model="any", input=items, tools=[ADD], stream=True))
        answer = events[-1].response
    else:
        answer = client.responses.create(model="any", input=items, tools=[ADD])
    assert [item.type for item in answer.output] == ["reasoning", "message", "function_call"]
    reasoning = answer.output[0]
    assert reasoning.id.startswith("rs") and reasoning.status == "completed" and reasoning.summary == []
    assert [(part.type, part.text) for part in reasoning.content or []] == [("reasoning_text", "Use add.")]
    items += [item.model_dump(exclude_none=True) for item in answer.output]
    items.append({"type": "function_call_output", "call_id": answer.output[2].call_id, "output": "5"})
    assert client.responses.create(model="any", input=items, tools=[ADD]).output_text == "It is 5."
    assert mock.requests[1].body["messages"][1:] == [
        {
            "role": "assistant",
            "content": "Adding.",
            "reasoning_content": "Use add.",
            "tool_calls": [
                {"id": call.id, "type": "function", "function": {"name": "add", "arguments": call.arguments_json()}}
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": "5"},
    ]
    first, second = _finish(server, rid).calls
    assert first.output["reasoning_content"] == "Use add."  # what the model thought, recorded
    assert second.input[1]["reasoning_content"] == "Use add."


def test_reasoning_streamed_before_the_answer(server: LightningServer, mock: MockLLMServer) -> None:
    """A streamed answer's reasoning is its first output item: added, its text as ``response.reasoning_text`` deltas,
    done, before the message and the tool call, each at its ``output_index``, all events in sequence."""
    call = MockToolCall(name="add", arguments={"a": 1, "b": 2})
    mock.set_replies([MockReply(reasoning="Think.", content="Hi.", tool_calls=[call])])
    rid, client = _running(server)
    events = list(client.responses.create(model="any", input="1+2?", tools=[ADD], stream=True))
    assert [event.sequence_number for event in events] == list(range(len(events)))
    item_events = [event for event in events if event.type.startswith("response.output_item.")]
    assert [(event.type, event.output_index, event.item.type) for event in item_events] == [
        ("response.output_item.added", 0, "reasoning"),
        ("response.output_item.done", 0, "reasoning"),
        ("response.output_item.added", 1, "message"),
        ("response.output_item.done", 1, "message"),
        ("response.output_item.added", 2, "function_call"),
        ("response.output_item.done", 2, "function_call"),
    ]
    reasoning_id = item_events[0].item.id
    of_reasoning = [event for event in events if getattr(event, "item_id", None) == reasoning_id]
    assert [event.type for event in of_reasoning] == [
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
    ]
    assert "".join(event.delta for event in of_reasoning if event.type == "response.reasoning_text.delta") == "Think."
    assert of_reasoning[2].text == "Think." and of_reasoning[3].part.type == "reasoning_text"
    assert of_reasoning[0].part.text == "" and events[0].response.output == []  # as they were when sent
    assert {event.output_index for event in of_reasoning} == {0}
    done = item_events[1].item
    assert done.status == "completed" and [part.text for part in done.content or []] == ["Think."]
    final = events[-1].response
    assert final.output[0].id == reasoning_id and final.output_text == "Hi."
    [recorded] = _finish(server, rid).calls
    assert recorded.output["reasoning_content"] == "Think." and recorded.output["content"] == "Hi."


def test_previous_response_id_continues_the_conversation(server: LightningServer, mock: MockLLMServer) -> None:
    rid, client = _running(server)
    first = client.responses.create(model="any", input="My name is Ada.", instructions="Be brief.")
    second = client.responses.create(model="any", input="What is my name?", previous_response_id=first.id)
    assert second.output_text == "echo: What is my name?"
    assert mock.requests[1].body["messages"] == [  # the first's instructions do not carry over
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": "echo: My name is Ada."},
        {"role": "user", "content": "What is my name?"},
    ]
    third = client.responses.create(model="any", input="Again?", previous_response_id=second.id, instructions="New.")
    assert mock.requests[2].body["messages"][-2:] == [
        {"role": "system", "content": "New."},
        {"role": "user", "content": "Again?"},
    ]
    assert len(mock.requests[2].body["messages"]) == 6 and third.status == "completed"
    with pytest.raises(openai.BadRequestError, match="is not a response of rollout"):
        client.responses.create(model="any", input="x", previous_response_id="resp_unknown")
    other_rid, other = _running(server)
    assert other_rid != rid
    with pytest.raises(openai.BadRequestError, match="only this rollout's responses can be continued"):
        other.responses.create(model="any", input="x", previous_response_id=first.id)
    assert len(mock.requests) == 3  # refused before anything went upstream
    assert len(_finish(server, rid).calls) == 3


def test_bad_input_and_incomplete_answer(server: LightningServer, mock: MockLLMServer) -> None:
    rid, client = _running(server)
    with pytest.raises(openai.BadRequestError, match="invalid Responses request: input must be a string or a list"):
        client.responses.create(model="any", input=42)  # type: ignore[arg-type]
    mock.set_replies([MockReply(content="cut", finish_reason="length")])
    events = list(client.responses.create(model="any", input="long", max_output_tokens=3, stream=True))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    assert mock.requests[-1].body["max_tokens"] == 3
    [call] = _finish(server, rid).calls
    assert call.output["finish_reason"] == "length"


def test_streamed_events_reach_the_agent_as_the_upstream_sends_them(server: LightningServer) -> None:
    gate = threading.Event()  # the upstream holds the rest of its stream until the agent saw the first text

    def data(delta: dict, finish: str | None = None) -> bytes:
        chunk = {"id": "c1", "model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return f"data: {json.dumps(chunk)}\n\n".encode()

    async def events() -> AsyncIterator[bytes]:
        yield data({"content": "Hel"})
        await asyncio.to_thread(gate.wait, 10)
        yield data({"content": "lo"})
        call = {"index": 0, "id": "call_7", "type": "function", "function": {"name": "add", "arguments": '{"a": 1'}}
        yield data({"tool_calls": [call]})
        yield data({"tool_calls": [{"index": 0, "function": {"arguments": ', "b": 2}'}}]})
        yield data({}, "tool_calls")
        usage = {"id": "c1", "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4}}
        yield f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode()

    async def chat(request: Request) -> StreamingResponse:
        sent.append(await request.json())
        return StreamingResponse(events(), media_type="text/event-stream")

    sent: list[dict] = []
    upstream = BackgroundServer(Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])).start()
    try:
        server.set_upstream(f"{upstream.url}/v1", "gated", "v9")
        rid, client = _running(server)
        early, seen = [], []
        for event in client.responses.create(model="any", input="1+2?", tools=[ADD], stream=True):
            seen.append(event)
            if event.type == "response.output_text.delta" and not gate.is_set():
                early.append(event.delta)
                gate.set()
        assert early == ["Hel"]  # before the upstream generated the rest
        assert sent[0]["stream"] is True and sent[0]["stream_options"] == {"include_usage": True}
        assert [event.sequence_number for event in seen] == list(range(len(seen)))
        assert seen[0].type == "response.created" and seen[-1].type == "response.completed"
        final = seen[-1].response
        assert final.output_text == "Hello" and final.usage.output_tokens == 4
        [call] = [item for item in final.output if item.type == "function_call"]
        assert call.call_id == "call_7" and json.loads(call.arguments) == {"a": 1, "b": 2}
        done = [event.item.type for event in seen if event.type == "response.output_item.done"]
        assert done == ["message", "function_call"]
        [recorded] = _finish(server, rid).calls
        assert recorded.metadata["response_id"] == final.id and recorded.metadata["stream"] is True
        assert recorded.output["content"] == "Hello" and recorded.output["tool_calls"][0]["id"] == "call_7"
    finally:
        gate.set()
        upstream.stop()


def test_chat_request_unit() -> None:
    body = {
        "model": "m",
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "reasoning", "summary": [], "encrypted_content": "opaque"},
        ],
        "tools": [ADD, {"type": "web_search"}, {"type": "namespace", "name": "agents", "tools": []}],
        "tool_choice": {"type": "function", "name": "add"},
        "parallel_tool_calls": False,
        "reasoning": {"effort": "high"},
        "store": False,
        "stream": True,
    }
    chat = responses.chat_request(body)
    assert chat["messages"] == [{"role": "user", "content": "hi"}]  # reasoning items have no chat form
    assert [tool["function"]["name"] for tool in chat["tools"]] == ["add"]  # web search, namespaces: not offered
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    assert chat["parallel_tool_calls"] is False and "stream" not in chat and "reasoning" not in chat
    assert "parallel_tool_calls" not in responses.chat_request({"input": "x", "parallel_tool_calls": True})
    history = responses.conversation([{"role": "user", "content": "a"}], {"content": None, "tool_calls": [{"id": 1}]})
    assert history[-1] == {"role": "assistant", "content": None, "tool_calls": [{"id": 1}]}
    history = responses.conversation([], {"content": "b", "tool_calls": [], "reasoning_content": "r"})
    assert history == [{"role": "assistant", "content": "b", "reasoning_content": "r"}]


def test_reasoning_items_go_to_the_assistant_message_after_them() -> None:
    """Reasoning items (their ``content``, else their ``summary``; several joined by a blank line) become the
    ``reasoning_content`` of the assistant message they preceded; encrypted-only items, and reasoning no assistant
    message follows, have nothing to send."""

    def reasoning(*texts: str, summary: bool = False) -> dict:
        parts = [{"type": "summary_text" if summary else "reasoning_text", "text": text} for text in texts]
        return {
            "type": "reasoning",
            "id": "rs_1",
            "summary": parts if summary else [],
            "content": [] if summary else parts,
        }

    def call(call_id: str) -> dict:
        return {"type": "function_call", "call_id": call_id, "name": "add", "arguments": "{}"}

    both = {**reasoning("raw"), "summary": [{"type": "summary_text", "text": "summed up"}]}
    items = [
        {"role": "user", "content": "q"},
        reasoning("a", "b"),
        call("c1"),
        reasoning("c", summary=True),  # interleaved: the same turn's second call
        call("c2"),
        {"type": "function_call_output", "call_id": "c1", "output": "1"},
        {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": "opaque"},
        both,
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]},
        reasoning("dangling"),
        {"role": "user", "content": "next"},
    ]
    messages = responses.chat_request({"input": items})["messages"]
    assert [(m["role"], m.get("reasoning_content")) for m in messages] == [
        ("user", None),
        ("assistant", "a\n\nb\n\nc"),
        ("tool", None),
        ("assistant", "raw"),  # its own reasoning, not the summary
        ("user", None),
    ]
    assert [entry["id"] for entry in messages[1]["tool_calls"]] == ["c1", "c2"]
    assert "tool_calls" not in messages[3] and messages[3]["content"] == "done"


def test_agl_server_option(tmp_path: Path, mock: MockLLMServer) -> None:
    parser = argparse.ArgumentParser()
    add_server_arguments(parser)
    arguments = ["--store", str(tmp_path / "s.db"), "--upstream", mock.base_url, "--translate-responses"]
    with server_from_args(parser.parse_args(arguments)) as server:
        _, client = _running(server)
        assert client.responses.create(model="any", input="hi").output_text == "echo: hi"
    assert [request.path for request in mock.requests] == ["/v1/chat/completions"]


def test_stream_translators_with_ids_repeated_on_every_chunk() -> None:
    """Some servers repeat a tool call's id on each of its chunks: still one call, its arguments joined."""

    def chunk(**delta: object) -> dict:
        return {"id": "c", "choices": [{"index": 0, "delta": delta}]}

    start = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a":'}}
    rest = {"index": 0, "id": "call_1", "function": {"arguments": " 1}"}}
    second = {"index": 1, "id": "call_2", "function": {"name": "add", "arguments": "{}"}}
    chunks = [chunk(content="Hi"), chunk(tool_calls=[start]), chunk(tool_calls=[rest]), chunk(tool_calls=[second])]
    stream = responses.ResponseStream("m", "resp_1")
    events = [event for item in chunks for event in stream.feed(item)] + stream.close()
    final = events[-1]["response"]
    assert [item["type"] for item in final["output"]] == ["message", "function_call", "function_call"]
    assert [item.get("arguments") for item in final["output"][1:]] == ['{"a": 1}', "{}"]
    messages = agentlightning_anthropic.MessageStream("m")
    events = [event for item in chunks for event in messages.feed(item)] + messages.close()
    starts = [event["content_block"]["type"] for event in events if event["type"] == "content_block_start"]
    assert starts == ["text", "tool_use", "tool_use"]
    partial = [event["delta"]["partial_json"] for event in events if event.get("delta", {}).get("partial_json")]
    assert partial == ['{"a":', " 1}", "{}"] and events[-2]["delta"]["stop_reason"] == "tool_use"
