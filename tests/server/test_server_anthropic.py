"""The Anthropic Messages API on the per-rollout proxy, driven by the real ``anthropic`` SDK: translated to the
upstream's chat completions and recorded as chat calls with the upstream's token ids."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

import agentlightning as agl  # noqa: F401 - imported as users do
from agentlightning._uvicorn import BackgroundServer
from agentlightning._wire import anthropic as agentlightning_anthropic
from agentlightning.server import LightningServer, Settings
from agentlightning.testing import MockLLMServer, MockReply, MockToolCall
from agentlightning.types import Rollout

anthropic = pytest.importorskip("anthropic")

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
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
        model_version="v3",
        settings=settings,
    ) as srv:
        yield srv


def _running(server: LightningServer) -> tuple[str, anthropic.Anthropic]:
    [rid] = server.enqueue([{"q": "x"}])
    lease = server.store.dequeue("test-worker", 30.0)
    assert lease.rollout_id == rid
    client = anthropic.Anthropic(base_url=f"{server.url}/rollouts/{rid}", api_key="unused", max_retries=0)
    return rid, client


def _finish(server: LightningServer, rid: str) -> Rollout:
    result = Rollout(rollout_id=rid, status="succeeded", final_reward=1.0)
    response = httpx.post(
        f"{server.url}/rollouts/{rid}/result",
        json={"attempt": 1, "worker_id": "test-worker", "rollout": result.model_dump(mode="json")},
    )
    assert response.status_code == 200, response.text
    [done] = server.wait([rid], timeout=5)
    return done


def _tool_round_trip(client: anthropic.Anthropic, stream: bool) -> list[object]:
    """The tool loop as Anthropic's docs write it: ask, run the tool the model asks for, send its result back."""
    messages: list[dict] = [{"role": "user", "content": "weather in Paris?"}]
    system = [{"type": "text", "text": "You are terse."}]
    answers = []
    for _ in range(2):
        if stream:
            with client.messages.stream(
                model="claude-x", max_tokens=64, system=system, tools=[WEATHER], messages=messages
            ) as events:
                texts = list(events.text_stream)
                answer = events.get_final_message()
            assert "".join(texts) == "".join(block.text for block in answer.content if block.type == "text")
        else:
            answer = client.messages.create(
                model="claude-x", max_tokens=64, system=system, tools=[WEATHER], messages=messages
            )
        answers.append(answer)
        if answer.stop_reason != "tool_use":
            break
        messages.append({"role": "assistant", "content": [block.model_dump() for block in answer.content]})
        results = [
            {"type": "tool_result", "tool_use_id": block.id, "content": f"sunny in {block.input['city']}"}
            for block in answer.content
            if block.type == "tool_use"
        ]
        messages.append({"role": "user", "content": results})
    return answers


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_messages_tool_round_trip_recorded_as_chat_calls(
    server: LightningServer, mock: MockLLMServer, stream: bool
) -> None:
    mock.set_replies(
        [
            MockReply(content="Checking.", tool_calls=[MockToolCall("get_weather", {"city": "Paris"})]),
            MockReply(content="It is sunny."),
        ]
    )
    rid, client = _running(server)
    first, second = _tool_round_trip(client, stream)
    assert first.stop_reason == "tool_use" and first.model == "claude-x"
    [text, use] = first.content
    assert text.text == "Checking." and use.name == "get_weather" and use.input == {"city": "Paris"}
    assert second.stop_reason == "end_turn" and second.content[0].text == "It is sunny."
    assert second.usage.output_tokens == len(mock.tokenizer.encode("It is sunny."))

    sent = [request.body for request in mock.requests]
    assert [request.path.rsplit("/", 2)[-2:] for request in mock.requests] == [["chat", "completions"]] * 2
    assert sent[0]["messages"][0] == {"role": "system", "content": "You are terse."}
    assert sent[0]["tools"][0]["function"]["parameters"] == WEATHER["input_schema"]
    assert sent[1]["messages"][-1] == {"role": "tool", "tool_call_id": use.id, "content": "sunny in Paris"}
    assert sent[1]["messages"][-2]["tool_calls"][0]["function"]["name"] == "get_weather"

    calls = _finish(server, rid).calls
    assert len(calls) == 2  # every request the agent sent is one call
    for call in calls:
        assert call.token_source == "server" and call.metadata["model_version"] == "v3"
        assert call.metadata["api"] == "messages" and call.metadata["endpoint"] == "chat.completions"
        assert call.metadata["stream"] is stream
        assert call.tools[0]["function"]["name"] == "get_weather"
        assert call.prompt_token_ids and call.completion_token_ids
    assert calls[0].output["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert calls[0].output["tool_calls"][0]["id"] == use.id
    assert calls[1].completion_token_ids == mock.tokenizer.encode("It is sunny.")
    assert calls[1].input[-1]["role"] == "tool"


def test_streamed_events_are_anthropic_events(server: LightningServer) -> None:
    rid, client = _running(server)
    with client.messages.create(
        model="claude-x", max_tokens=16, messages=[{"role": "user", "content": "hi"}], stream=True
    ) as events:
        kinds = [event.type for event in events]
    assert kinds == [
        "message_start",
        "content_block_start",
        "content_block_delta",  # "echo:", as the upstream's first chunk
        "content_block_delta",  # " hi"
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    [call] = _finish(server, rid).calls
    assert call.output["content"] == "echo: hi"
    assert call.metadata["sampling"]["max_tokens"] == 16  # recorded as the chat call sent, without stream options


def test_streamed_messages_reach_the_agent_as_the_upstream_sends_them(server: LightningServer) -> None:
    gate = threading.Event()  # the upstream holds the rest of its stream until the agent saw the first text

    async def events() -> AsyncIterator[bytes]:
        chunk = {"id": "c1", "model": "m", "choices": [{"index": 0, "delta": {"reasoning_content": "Think."}}]}
        yield f"data: {json.dumps(chunk)}\n\n".encode()
        chunk["choices"] = [{"index": 0, "delta": {"content": "Hel"}}]
        yield f"data: {json.dumps(chunk)}\n\n".encode()
        await asyncio.to_thread(gate.wait, 10)
        call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
        for delta in ({"content": "lo"}, {"tool_calls": [call]}, {"tool_calls": [{"index": 0, "function": {}}]}):
            chunk["choices"] = [{"index": 0, "delta": delta}]
            yield f"data: {json.dumps(chunk)}\n\n".encode()
        chunk["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"] = '{"city": "Paris"}'
        yield f"data: {json.dumps(chunk)}\n\n".encode()
        chunk["choices"] = [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]
        yield f"data: {json.dumps(chunk)}\n\n".encode()
        usage = {"id": "c1", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 5}}
        yield f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode()

    async def chat(request: Request) -> StreamingResponse:
        sent.append(await request.json())
        return StreamingResponse(events(), media_type="text/event-stream")

    sent: list[dict] = []
    upstream = BackgroundServer(Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])).start()
    try:
        server.set_upstream(f"{upstream.url}/v1", "gated", "v7")
        rid, client = _running(server)
        messages = [{"role": "user", "content": "weather?"}]
        with client.messages.stream(model="claude-x", max_tokens=64, tools=[WEATHER], messages=messages) as stream:
            early = []  # text that reached the agent while the upstream held the rest of its answer
            for event in stream:
                if event.type == "text" and not gate.is_set():
                    early.append(event.text)
                    gate.set()
            answer = stream.get_final_message()
        assert early == ["Hel"]
        assert sent[0]["stream"] is True and sent[0]["stream_options"] == {"include_usage": True}
        [thinking, text, use] = answer.content
        assert thinking.type == "thinking" and thinking.thinking == "Think."
        assert text.text == "Hello" and use.name == "get_weather" and use.input == {"city": "Paris"}
        assert answer.stop_reason == "tool_use" and answer.usage.output_tokens == 5
        [call] = _finish(server, rid).calls
        assert call.status == "ok" and call.metadata["stream"] is True
        assert call.output["content"] == "Hello" and call.output["tool_calls"][0]["function"]["name"] == "get_weather"
    finally:
        gate.set()
        upstream.stop()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_thinking_sent_back_reaches_the_upstream_and_the_call(
    server: LightningServer, mock: MockLLMServer, stream: bool
) -> None:
    """Extended thinking as Anthropic's docs write the tool loop: the assistant's blocks go back as they came,
    thinking (with its signature) included; the upstream gets them as the assistant's ``reasoning_content``."""
    mock.set_replies(
        [
            MockReply(
                reasoning="Paris needs a lookup.",
                content="Checking.",
                tool_calls=[MockToolCall("get_weather", {"city": "Paris"})],
            ),
            MockReply(reasoning="It said sunny.", content="It is sunny."),
        ]
    )
    rid, client = _running(server)
    first, second = _tool_round_trip(client, stream)
    [thinking, _, _] = first.content
    assert thinking.type == "thinking" and thinking.thinking == "Paris needs a lookup."
    assert second.content[0].type == "thinking" and second.content[0].thinking == "It said sunny."

    sent_back = mock.requests[1].body["messages"][-2]  # the assistant turn, before the tool result
    assert sent_back["reasoning_content"] == "Paris needs a lookup."
    assert sent_back["thinking_blocks"] == [
        {"type": "thinking", "thinking": "Paris needs a lookup.", "signature": thinking.signature}
    ]
    assert sent_back["content"] == "Checking." and sent_back["tool_calls"][0]["function"]["name"] == "get_weather"
    calls = _finish(server, rid).calls
    assert calls[1].input[-2] == sent_back  # recorded as sent
    assert calls[0].output["reasoning_content"] == "Paris needs a lookup."  # what the model thought, recorded
    assert calls[1].completion_token_ids == mock.tokenizer.encode("It said sunny.It is sunny.")
    assert all(call.token_source == "server" and call.metadata["stream"] is stream for call in calls)


def test_thinking_blocks_of_a_signed_conversation_keep_their_signatures() -> None:
    """Blocks from another server (Anthropic's own signatures, redacted thinking) pass as they are, so that the
    recorded call holds everything the agent would send back to that server; several join into one reasoning."""
    thinking = [
        {"type": "thinking", "thinking": "First.", "signature": "EqQBCkYIARgCKkC"},
        {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"},
        {"type": "thinking", "thinking": "Second.", "signature": "EpoCCkYIBRgC"},
    ]
    chat = agentlightning_anthropic.chat_request(
        {
            "model": "claude-x",
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [*thinking, {"type": "text", "text": "Hello."}]},
                {"role": "user", "content": [{"type": "text", "text": "again"}]},
            ],
        }
    )
    assistant = chat["messages"][1]
    assert assistant == {
        "role": "assistant",
        "content": "Hello.",
        "reasoning_content": "First.\n\nSecond.",
        "thinking_blocks": thinking,
    }


# The tiny model's ChatML template, with the assistant's reasoning rendered before its answer as Qwen3's template does.
def _thinking_template() -> str:
    from agentlightning.trainers.chat_template import CHATML_TOOLS_TEMPLATE

    answer = "{{ '<|im_start|>assistant\\n' + (message['content'] or '') }}"
    assert answer in CHATML_TOOLS_TEMPLATE
    thinking = (
        "{{ '<|im_start|>assistant\\n' }}"
        "{% if message['reasoning_content'] %}{{ '<think>' + message['reasoning_content'] + '</think>' }}{% endif %}"
        "{{ message['content'] or '' }}"
    )
    return CHATML_TOOLS_TEMPLATE.replace(answer, thinking)


@pytest.mark.slow
def test_thinking_sent_back_reaches_vllms_chat_template(tmp_path: Path) -> None:
    """vLLM 0.31 (its CPU build, `make vllm-venv`) takes the thinking the proxy sends as ``reasoning_content`` and gives
    it to the chat template: the prompt token ids it returns, recorded on the call, hold the rendered thinking."""
    from vllm_venv import require_vllm

    require_vllm()
    pytest.importorskip("torch")
    from agentlightning.trainers.backends.vllm.server import VLLMBackend
    from agentlightning.trainers.models import tiny_model

    model, tokenizer = tiny_model(seed=2, hidden_size=256)  # head size 64: vLLM's CPU attention supports it
    tokenizer.chat_template = _thinking_template()
    model.save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    backend = VLLMBackend(
        tmp_path / "tiny",
        tokenizer=tokenizer,
        sync="disk",
        dtype="float32",
        max_model_len=512,
        env={"VLLM_CPU_KVCACHE_SPACE": "1"},
        startup_timeout=400,
    ).start()
    try:
        with LightningServer(tmp_path / "store.db", settings=Settings()) as server:
            server.set_upstream(backend.base_url, "policy", "v0", logprobs=True, translate_responses=True)
            rid, client = _running(server)
            messages = [
                {"role": "user", "content": "Weather?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "Look it up.", "signature": ""},
                        {"type": "text", "text": "Sunny."},
                    ],
                },
                {"role": "user", "content": "And now?"},
            ]
            answer = client.messages.create(model="claude-x", max_tokens=4, messages=messages)
            assert answer.stop_reason in ("end_turn", "max_tokens")
            [call] = _finish(server, rid).calls
    finally:
        backend.stop()
    assert call.status == "ok" and call.token_source == "server" and call.metadata["model_version"] == "v0"
    assert call.input[1]["reasoning_content"] == "Look it up."
    prompt = tokenizer.decode(call.prompt_token_ids)
    assert "<|im_start|>assistant\n<think>Look it up.</think>Sunny.<|im_end|>" in prompt, prompt
    assert len(call.completion_logprobs) == len(call.completion_token_ids) > 0


def test_whole_answer_with_reasoning_has_a_thinking_block() -> None:
    chat = {"id": "c", "choices": [{"message": {"reasoning_content": "Hmm.", "content": "4"}, "finish_reason": "stop"}]}
    message = agentlightning_anthropic.message_from_chat(chat, "claude-x")
    assert [block["type"] for block in message["content"]] == ["thinking", "text"]
    assert message["content"][0] == {"type": "thinking", "thinking": "Hmm.", "signature": ""}


def test_count_tokens_and_models_answered(server: LightningServer, mock: MockLLMServer) -> None:
    rid, client = _running(server)
    counted = client.messages.count_tokens(model="claude-x", messages=[{"role": "user", "content": "hello there"}])
    assert counted.input_tokens > 0
    [model] = list(client.models.list())
    assert model.id == "mock-model" and model.type == "model"
    assert mock.requests == [] and _finish(server, rid).calls == []  # neither reached the upstream nor was recorded


def test_messages_that_are_not_a_list_get_a_clear_400(server: LightningServer, mock: MockLLMServer) -> None:
    rid, client = _running(server)
    with pytest.raises(anthropic.BadRequestError, match="messages must be a list"):
        client.messages.create(model="claude-x", max_tokens=16, messages="hi")  # type: ignore[arg-type]
    assert mock.requests == []
    del rid


def test_openai_responses_path_unchanged(server: LightningServer, mock: MockLLMServer) -> None:
    rid, _ = _running(server)
    answer = httpx.post(
        f"{server.url}/rollouts/{rid}/v1/responses", json={"model": "m", "input": "hi"}, timeout=10
    ).json()
    assert answer["output"][0]["content"][0]["text"] == "echo: hi"
    assert json.loads(json.dumps(answer))["object"] == "response"


def test_logprobs_and_version_recorded_when_training_wants_them(server: LightningServer, mock: MockLLMServer) -> None:
    server.set_upstream(mock.base_url, "mock-model", "v5", logprobs=True)
    rid, client = _running(server)
    client.messages.create(model="claude-x", max_tokens=16, messages=[{"role": "user", "content": "hi"}])
    assert mock.requests[-1].body["logprobs"] is True
    [call] = _finish(server, rid).calls
    assert call.metadata["model_version"] == "v5"
    assert call.completion_logprobs is not None and len(call.completion_logprobs) == len(call.completion_token_ids)


def test_upstream_error_reaches_the_agent_with_its_status(server: LightningServer, mock: MockLLMServer) -> None:
    mock.set_replies([MockReply(status=400, error_message="context too long")])
    rid, client = _running(server)
    with pytest.raises(anthropic.BadRequestError, match="context too long"):
        client.messages.create(model="claude-x", max_tokens=16, messages=[{"role": "user", "content": "hi"}])
    [call] = _finish(server, rid).calls
    assert call.status == "error" and "context too long" in call.error
