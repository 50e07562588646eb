"""Capture of the real ``openai`` client against the mock server: every API shape becomes exactly one Call."""

from __future__ import annotations

import asyncio
import importlib
import json
import multiprocessing
import multiprocessing.queues
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from pydantic import BaseModel

import agentlightning as agl
from agentlightning.capture._context import RolloutRecorder, recording
from agentlightning.testing import MockLLMServer, MockReply, MockToolCall, render_chat_prompt

MESSAGES = [{"role": "system", "content": "You write SQL."}, {"role": "user", "content": "count users"}]
# The HTTP library under the installed openai client: httpx2 for openai 3, httpx for openai 2.
http = importlib.import_module(openai.DefaultHttpxClient.__mro__[1].__module__.partition(".")[0])
TOOLS = [{"type": "function", "function": {"name": "run_sql", "parameters": {"type": "object"}}}]


@pytest.fixture(autouse=True)
def _instrumented() -> None:
    agl.instrument("openai")
    agl.instrument(http.__name__)  # as in a rollout: the requests the resource methods record are not recorded twice


@pytest.fixture
def server() -> MockLLMServer:
    with MockLLMServer(token_ids=True) as srv:
        yield srv


def sync_client(server: MockLLMServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)


def only_call(recorder: RolloutRecorder) -> agl.Call:
    calls = recorder.calls
    assert len(calls) == 1, [c.metadata["api"] for c in calls]
    return calls[0]


def test_sync_chat_call_records_everything(server: MockLLMServer) -> None:
    server.set_replies(["SELECT count(*) FROM users"])
    recorder = RolloutRecorder("ro-sync")
    with recording(recorder), agl.role("writer"):
        sync_client(server).chat.completions.create(
            model="qwen",
            messages=MESSAGES,
            temperature=0.3,
            max_tokens=64,
            logprobs=True,
            tools=TOOLS,
            extra_body={"top_k": 5},
        )
    call = only_call(recorder)
    tok = server.tokenizer
    assert (call.kind, call.role, call.name, call.status, call.rollout_id) == ("llm", "writer", "qwen", "ok", "ro-sync")
    assert call.input == MESSAGES and call.tools == TOOLS
    assert call.output == {"content": "SELECT count(*) FROM users", "tool_calls": [], "finish_reason": "stop"}
    assert call.prompt_token_ids == tok.encode(render_chat_prompt(MESSAGES, TOOLS))
    assert call.completion_token_ids == tok.encode("SELECT count(*) FROM users")
    assert call.completion_logprobs == [tok.logprob(i) for i in call.completion_token_ids]
    assert call.token_source == "response"
    assert call.metadata["endpoint"] == server.base_url
    assert call.metadata["api"] == "chat.completions" and call.metadata["stream"] is False
    assert call.metadata["sampling"] == {"temperature": 0.3, "max_tokens": 64, "logprobs": True, "top_k": 5}
    assert call.metadata["usage"]["completion_tokens"] == len(call.completion_token_ids)
    assert call.response_id and call.response_id.startswith("chatcmpl-")
    assert call.start_time <= call.end_time
    assert recorder.unfinished_endpoints() == set()
    assert list(call.__dict__) == list(agl.Call.model_fields)
    assert call == agl.Call.model_validate(call.model_dump())


def test_no_token_ids_means_no_token_source() -> None:
    with MockLLMServer() as server:
        recorder = RolloutRecorder("ro")
        with recording(recorder):
            sync_client(server).chat.completions.create(model="m", messages=MESSAGES)
    call = only_call(recorder)
    assert call.prompt_token_ids is None and call.completion_token_ids is None and call.token_source is None


async def test_async_chat_and_responses(server: MockLLMServer) -> None:
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    recorder = RolloutRecorder("ro-async")
    with recording(recorder):
        await client.chat.completions.create(model="m", messages=MESSAGES)
        await client.responses.create(model="m", input="hello", instructions="be nice")
    await client.close()
    chat, response = recorder.calls
    assert chat.output["content"] == "echo: count users" and chat.sequence == 0
    assert response.metadata["api"] == "responses" and response.sequence == 1
    assert response.input == [{"role": "system", "content": "be nice"}, {"role": "user", "content": "hello"}]
    assert response.output == {"content": "echo: hello", "tool_calls": [], "finish_reason": "stop"}
    assert response.prompt_token_ids == server.tokenizer.encode(render_chat_prompt(response.input))


def test_streaming_recorded_when_consumed(server: MockLLMServer) -> None:
    server.set_replies(["one two three"])
    recorder = RolloutRecorder("ro")
    with recording(recorder):
        stream = sync_client(server).chat.completions.create(
            model="m", messages=MESSAGES, stream=True, logprobs=True, stream_options={"include_usage": True}
        )
        assert recorder.calls == []  # nothing read yet
        assert recorder.unfinished_endpoints() == {server.base_url}
        chunks = list(stream)
    call = only_call(recorder)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "one two three"
    assert call.output == {"content": "one two three", "tool_calls": [], "finish_reason": "stop"}
    assert call.metadata["stream"] is True and call.metadata["usage"]["completion_tokens"] == 13
    assert call.completion_token_ids == server.tokenizer.encode("one two three")
    assert call.completion_logprobs == [server.tokenizer.logprob(i) for i in call.completion_token_ids]
    assert call.prompt_token_ids == server.tokenizer.encode(render_chat_prompt(MESSAGES))


def test_stream_context_manager_helper_and_tool_call_stream(server: MockLLMServer) -> None:
    server.set_replies([MockReply(content="let me", tool_calls=[MockToolCall("run_sql", {"q": "SELECT 1"})])])
    recorder = RolloutRecorder("ro")
    with recording(recorder):
        with sync_client(server).chat.completions.stream(model="m", messages=MESSAGES, tools=TOOLS) as stream:
            final = stream.get_final_completion()
    call = only_call(recorder)
    assert final.choices[0].message.tool_calls[0].function.name == "run_sql"
    assert call.output["content"] == "let me" and call.output["finish_reason"] == "tool_calls"
    assert call.output["tool_calls"] == [
        {
            "id": final.choices[0].message.tool_calls[0].id,
            "type": "function",
            "function": {"name": "run_sql", "arguments": '{"q": "SELECT 1"}'},
        }
    ]


def test_stream_closed_early_is_recorded_once(server: MockLLMServer) -> None:
    server.set_replies(["a b c d e f"])
    recorder = RolloutRecorder("ro")
    with recording(recorder):
        with sync_client(server).chat.completions.create(model="m", messages=MESSAGES, stream=True) as stream:
            next(iter(stream))
            next(iter(stream))
    call = only_call(recorder)
    assert call.output["content"] == "a" and call.output["finish_reason"] == "incomplete_stream"


async def test_async_stream(server: MockLLMServer) -> None:
    server.set_replies(["async words"])
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    recorder = RolloutRecorder("ro")
    with recording(recorder):
        stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        pieces = [chunk.choices[0].delta.content async for chunk in stream if chunk.choices]
    await client.close()
    assert "".join(p or "" for p in pieces) == "async words"
    assert only_call(recorder).output["content"] == "async words"


def test_raw_response_recorded_once(server: MockLLMServer) -> None:
    recorder = RolloutRecorder("ro")
    client = sync_client(server)
    with recording(recorder):
        raw = client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES)
        first, second = raw.parse(), raw.parse()
        assert raw.headers["content-type"].startswith("application/json")
    call = only_call(recorder)
    assert first is second and first.choices[0].message.content == "echo: count users"
    assert call.output["content"] == "echo: count users" and call.metadata["raw_response"] is True
    assert call.completion_token_ids == first.choices[0].model_extra["token_ids"]


def test_raw_streaming_and_streaming_response(server: MockLLMServer) -> None:
    recorder = RolloutRecorder("ro")
    client = sync_client(server)
    with recording(recorder):
        raw = client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES, stream=True)
        assert recorder.calls == []
        text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
        with client.chat.completions.with_streaming_response.create(model="m", messages=MESSAGES) as response:
            parsed = response.parse()
    raw_call, streaming_call = recorder.calls
    assert raw_call.output["content"] == text == "echo: count users" and raw_call.metadata["stream"] is True
    assert streaming_call.output["content"] == parsed.choices[0].message.content


async def test_async_raw_response_recorded_once(server: MockLLMServer) -> None:
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    recorder = RolloutRecorder("ro")
    with recording(recorder):
        raw = await client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES)
        raw.parse()
        async with client.chat.completions.with_streaming_response.create(model="m", messages=MESSAGES) as resp:
            await resp.parse()
    await client.close()
    assert [c.output["content"] for c in recorder.calls] == ["echo: count users"] * 2


class Answer(BaseModel):
    sql: str
    confidence: float


def test_parse_structured_output(server: MockLLMServer) -> None:
    server.set_replies(['{"sql": "SELECT 1", "confidence": 0.9}'])
    recorder = RolloutRecorder("ro")
    with recording(recorder):
        parsed = sync_client(server).chat.completions.parse(model="m", messages=MESSAGES, response_format=Answer)
    call = only_call(recorder)
    assert parsed.choices[0].message.parsed == Answer(sql="SELECT 1", confidence=0.9)
    assert call.metadata["api"] == "chat.completions.parse"
    assert call.metadata["sampling"]["response_format"] == "Answer"
    assert json.loads(call.output["content"]) == {"sql": "SELECT 1", "confidence": 0.9}
    json.dumps(call.model_dump(mode="json"))


def test_responses_stream_and_tool_calls(server: MockLLMServer) -> None:
    server.set_replies(["streamed answer", MockReply(tool_calls=[MockToolCall("run_sql", {"q": "x"}, id="call_1")])])
    recorder = RolloutRecorder("ro")
    client = sync_client(server)
    with recording(recorder):
        with client.responses.stream(model="m", input="q") as stream:
            stream.get_final_response()
        client.responses.create(
            model="m",
            input=[{"role": "user", "content": "use a tool"}],
            tools=[{"type": "function", "name": "run_sql", "parameters": {}}],
        )
    streamed, tool = recorder.calls
    assert streamed.output["content"] == "streamed answer" and streamed.metadata["stream"] is True
    assert tool.output["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "run_sql", "arguments": '{"q": "x"}'}}
    ]
    assert tool.output["finish_reason"] == "tool_calls"


def test_tool_calls_non_stream(server: MockLLMServer) -> None:
    server.set_replies([MockReply(tool_calls=[MockToolCall("run_sql", {"q": "SELECT 1"}, id="call_9")])])
    recorder = RolloutRecorder("ro")
    with recording(recorder):
        sync_client(server).chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS)
    call = only_call(recorder)
    assert call.output == {
        "content": None,
        "finish_reason": "tool_calls",
        "tool_calls": [
            {"id": "call_9", "type": "function", "function": {"name": "run_sql", "arguments": '{"q": "SELECT 1"}'}}
        ],
    }


@pytest.mark.parametrize("stream", [False, True])
def test_legacy_completions(server: MockLLMServer, stream: bool) -> None:
    recorder = RolloutRecorder("ro")
    with recording(recorder):
        reply = sync_client(server).completions.create(model="m", prompt="2+2=", logprobs=1, stream=stream)
        if stream:
            assert "".join(chunk.choices[0].text for chunk in reply if chunk.choices) == "echo: 2+2="
    call = only_call(recorder)
    assert call.input == "2+2=" and call.output["content"] == "echo: 2+2="
    assert call.metadata["stream"] is stream and call.output["finish_reason"] == "stop"
    assert call.prompt_token_ids == server.tokenizer.encode("2+2=")
    assert call.completion_logprobs == [server.tokenizer.logprob(i) for i in call.completion_token_ids]


@pytest.mark.parametrize(("status", "error"), [(500, openai.InternalServerError), (429, openai.RateLimitError)])
def test_api_errors_recorded_and_reraised_unchanged(server: MockLLMServer, status: int, error: type) -> None:
    server.set_replies([MockReply(status=status, error_message="overloaded")])
    recorder = RolloutRecorder("ro")
    with recording(recorder), pytest.raises(error, match="overloaded") as raised:
        sync_client(server).chat.completions.create(model="m", messages=MESSAGES)
    assert type(raised.value) is error
    call = only_call(recorder)
    assert call.status == "error" and "overloaded" in call.error and call.error.startswith(error.__name__)
    assert call.metadata["http_status"] == status and call.output is None


def test_timeout_recorded_as_error(server: MockLLMServer) -> None:
    server.set_replies([MockReply(hang=True)])
    recorder = RolloutRecorder("ro")
    with recording(recorder), pytest.raises(openai.APITimeoutError):
        sync_client(server).with_options(timeout=0.2).chat.completions.create(model="m", messages=MESSAGES)
    assert only_call(recorder).error.startswith("APITimeoutError")


def test_outside_rollout_nothing_recorded_but_remembered_while_one_runs(server: MockLLMServer) -> None:
    from agentlightning.capture import stray_calls_since

    start = time.time()
    reply = sync_client(server).chat.completions.create(model="m", messages=MESSAGES)  # no rollout anywhere
    assert reply.choices[0].message.content == "echo: count users" and stray_calls_since(start) == []
    recorder = RolloutRecorder("ro")
    with recording(recorder):
        # A thread started without copying the context runs outside the rollout while it is running.
        thread = threading.Thread(
            target=sync_client(server).chat.completions.create, kwargs={"model": "m", "messages": MESSAGES}
        )
        thread.start()
        thread.join()
    assert recorder.calls == [] and stray_calls_since(start) == [(pytest.approx(time.time(), abs=5), server.base_url)]


def test_capture_bug_never_breaks_the_agent(
    server: MockLLMServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from agentlightning.adapters import _stainless

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("capture bug")

    monkeypatch.setattr(_stainless, "read_response", broken)
    recorder = RolloutRecorder("ro")
    with recording(recorder):
        reply = sync_client(server).chat.completions.create(model="m", messages=MESSAGES)
    assert reply.choices[0].message.content == "echo: count users"
    assert recorder.calls == [] and "capture bug" in caplog.text
    monkeypatch.setattr(_stainless.ClientCall, "__init__", broken)
    with recording(recorder):
        assert sync_client(server).chat.completions.create(model="m", messages=MESSAGES).choices


def test_record_keeps_the_call_as_made(server: MockLLMServer) -> None:
    recorder = RolloutRecorder("ro")
    messages = [dict(message) for message in MESSAGES]
    extra_body = {"top_k": 5}
    with recording(recorder):
        reply = sync_client(server).chat.completions.create(model="m", messages=messages, extra_body=extra_body)
        # What agents do next: append the reply, edit a message in place, reuse the options dict, post-process.
        messages.append({"role": "assistant", "content": "later"})
        messages[0]["content"] = "edited"
        extra_body["top_k"] = 50
        reply.choices[0].message.content = "post-processed"
    call = only_call(recorder)  # built now, after the changes
    assert call.input == MESSAGES and call.metadata["sampling"] == {"top_k": 5}
    assert call.output["content"] == "echo: count users"


def test_generator_messages_are_not_consumed_by_capture(server: MockLLMServer) -> None:
    recorder = RolloutRecorder("ro")
    with recording(recorder):
        sync_client(server).chat.completions.create(model="m", messages=(m for m in MESSAGES))
    assert server.requests[-1].messages == MESSAGES and only_call(recorder).input == MESSAGES


def test_pydantic_messages_passed_back_are_recorded_as_dicts(server: MockLLMServer) -> None:
    client = sync_client(server)
    recorder = RolloutRecorder("ro")
    with recording(recorder):
        first = client.chat.completions.create(model="m", messages=MESSAGES)
        client.chat.completions.create(
            model="m", messages=[*MESSAGES, first.choices[0].message, {"role": "user", "content": "again"}]
        )
    second = recorder.calls[1]
    assert second.input[2]["role"] == "assistant" and second.input[2]["content"] == "echo: count users"
    json.dumps(second.model_dump(mode="json"))


def test_install_uninstall_idempotent(server: MockLLMServer) -> None:
    from agentlightning.adapters import openai as adapter
    from openai.resources.chat.completions.completions import Completions

    adapter.install()
    adapter.install()
    wrapped = Completions.__dict__["create"]
    adapter.uninstall()
    adapter.uninstall()
    try:
        assert not adapter.is_installed() and Completions.__dict__["create"] is wrapped.__wrapped__
        recorder = RolloutRecorder("ro")
        with recording(recorder):
            sync_client(server).chat.completions.create(model="m", messages=MESSAGES)
        (call,) = recorder.calls  # the HTTP layer's adapter records what the openai adapter no longer sees
        assert call.output["content"] == "echo: count users"
        agl.uninstrument(http.__name__)
        with recording(recorder := RolloutRecorder("ro")):
            sync_client(server).chat.completions.create(model="m", messages=MESSAGES)
        assert recorder.calls == []
    finally:
        adapter.install()
        agl.instrument(http.__name__)
    assert adapter.is_installed()


def test_otel_span_with_genai_attributes(server: MockLLMServer, monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    server.set_replies(["ok", MockReply(status=500)])
    recorder = RolloutRecorder("ro-otel")
    with recording(recorder), agl.role("writer"), tracer.start_as_current_span("agent"):
        client = sync_client(server)
        client.chat.completions.create(model="qwen", messages=MESSAGES, temperature=0.5)
        with pytest.raises(openai.InternalServerError):
            client.chat.completions.create(model="qwen", messages=MESSAGES)
    monkeypatch.undo()
    spans = [s for s in exporter.get_finished_spans() if s.name.startswith("chat")]
    assert [s.name for s in spans] == ["chat qwen", "chat qwen"]
    ok, failed = spans
    attributes = dict(ok.attributes)
    assert attributes["gen_ai.operation.name"] == "chat" and attributes["gen_ai.request.model"] == "qwen"
    assert attributes["gen_ai.request.temperature"] == 0.5 and attributes["gen_ai.usage.output_tokens"] == 2
    assert attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert attributes["agentlightning.rollout_id"] == "ro-otel" and attributes["agentlightning.role"] == "writer"
    assert attributes["server.address"] == "127.0.0.1" and attributes["server.port"] == server.port
    assert ok.parent is not None and ok.kind == trace.SpanKind.CLIENT
    assert failed.status.status_code == trace.StatusCode.ERROR
    assert dict(failed.attributes)["error.type"] == "InternalServerError"
    # The spans describe the very records the rollout keeps.
    assert [s.attributes["agentlightning.call_id"] for s in spans] == [c.call_id for c in recorder.calls]


@pytest.mark.parametrize(
    "options",
    [{}, {"include_response_headers": True}, {"streaming": True}, {"use_responses_api": True}],
    ids=["default", "headers", "stream", "responses"],
)
def test_langchain_openai_calls_recorded_once(server: MockLLMServer, options: dict) -> None:
    # langchain-openai goes through with_raw_response (and .parse()) on most paths: still exactly one Call.
    chat_openai = pytest.importorskip("langchain_openai").ChatOpenAI
    model = chat_openai(base_url=server.base_url, api_key="x", model="m", max_retries=0, **options)
    recorder = RolloutRecorder("ro")
    with recording(recorder):
        model.invoke("hello there")
    call = only_call(recorder)
    assert call.output["content"] == "echo: hello there"
    assert call.completion_token_ids == server.tokenizer.encode("echo: hello there")
    assert call.metadata["stream"] is bool(options.get("streaming"))


@pytest.fixture
def dropping_server() -> Iterator[str]:
    """A loopback HTTP server that starts a chat stream, sends one chunk, and drops the connection."""
    chunk = json.dumps(
        {
            "id": "c1",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "delta": {"content": "half"}, "finish_reason": None}],
        }
    )
    event = f"data: {chunk}\n\n".encode()
    listener = socket.create_server(("127.0.0.1", 0))

    def serve_one() -> None:  # the client makes exactly one request (max_retries=0)
        connection, _ = listener.accept()
        with connection:
            connection.recv(65536)
            connection.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n" + f"{len(event):x}\r\n".encode() + event + b"\r\n"
            )

    thread = threading.Thread(target=serve_one, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    thread.join(timeout=5)
    listener.close()


def test_stream_broken_mid_way_is_recorded_as_error_with_what_arrived(dropping_server: str) -> None:
    recorder = RolloutRecorder("ro")
    client = openai.OpenAI(base_url=dropping_server, api_key="x", max_retries=0)
    received: list[str] = []
    with recording(recorder), pytest.raises(Exception) as raised:
        for chunk in client.chat.completions.create(model="m", messages=MESSAGES, stream=True):
            received.append(chunk.choices[0].delta.content)
    call = only_call(recorder)
    assert received == ["half"]
    assert call.status == "error" and call.error.startswith(type(raised.value).__name__)
    assert call.output["content"] == "half" and call.metadata["stream"] is True


async def test_async_stream_closed_early_is_recorded_once(server: MockLLMServer) -> None:
    server.set_replies(["one two three four"])
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    recorder = RolloutRecorder("ro")
    with recording(recorder):
        stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        iterator = stream.__aiter__()
        await iterator.__anext__()
        await iterator.__anext__()
        await stream.close()
        await stream._iterator.aclose()  # what the event loop's async-generator finaliser does when it is collected
    await client.close()
    await asyncio.sleep(0)
    call = only_call(recorder)
    assert call.output["content"] == "one" and call.output["finish_reason"] == "incomplete_stream"


def test_registry_and_adapter_agree_when_the_adapter_is_used_directly(server: MockLLMServer) -> None:
    from agentlightning.adapters import openai as adapter

    from agentlightning.capture._instrument import installed_adapters

    agl.instrument("openai")
    adapter.uninstall()  # behind the registry's back
    try:
        assert "openai" not in installed_adapters()
        agl.instrument("openai")  # must really patch again, not trust a stale note
        assert adapter.is_installed() and "openai" in installed_adapters()
        recorder = RolloutRecorder("ro")
        with recording(recorder):
            sync_client(server).chat.completions.create(model="m", messages=MESSAGES)
        assert len(recorder.calls) == 1
        agl.uninstrument("openai")
        adapter.install()  # installed directly: agl.uninstrument must still remove it
        agl.uninstrument("openai")
        assert not adapter.is_installed() and "openai" not in installed_adapters()
    finally:
        agl.instrument("openai")


def _call_id_in_child(base_url: str, out: multiprocessing.queues.Queue) -> None:
    recorder = RolloutRecorder("ro-child")
    with recording(recorder):
        openai.OpenAI(base_url=base_url, api_key="x", max_retries=0).chat.completions.create(
            model="m", messages=MESSAGES
        )
    out.put(only_call(recorder).call_id)


def test_call_ids_are_unique_across_calls_and_forked_children(server: MockLLMServer) -> None:
    recorder = RolloutRecorder("ro")
    with recording(recorder):
        for _ in range(3):
            sync_client(server).chat.completions.create(model="m", messages=MESSAGES)
    ids = [call.call_id for call in recorder.calls]
    fork = multiprocessing.get_context("fork")
    out = fork.Queue()
    children = [fork.Process(target=_call_id_in_child, args=(server.base_url, out)) for _ in range(2)]
    for child in children:
        child.start()
    ids += [out.get(timeout=30) for _ in children]
    for child in children:
        child.join(timeout=30)
    assert len(set(ids)) == 5 and all(call_id.startswith("call-") for call_id in ids), ids


@pytest.mark.parametrize("malformed", [["seven", None], [7.5, 8], [7, [8]], {"0": 7}])
def test_token_ids_are_exact_copies_and_malformed_ones_do_not_lose_the_call(
    malformed: object, caplog: pytest.LogCaptureFixture
) -> None:
    def backend(token_ids: object) -> openai.OpenAI:
        body = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "prompt_token_ids": [1, 2, 3],
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "token_ids": token_ids,
                    "message": {"role": "assistant", "content": "hi"},
                }
            ],
        }

        def handler(request: http.Request) -> http.Response:
            return http.Response(200, json=body)

        return openai.OpenAI(
            base_url="http://backend.local/v1",
            api_key="x",
            max_retries=0,
            http_client=http.Client(transport=http.MockTransport(handler)),
        )

    recorder = RolloutRecorder("ro")
    with recording(recorder):
        reply = backend([7, 8]).chat.completions.create(model="m", messages=MESSAGES)
        backend(malformed).chat.completions.create(model="m", messages=MESSAGES)
    good, bad = recorder.calls
    assert good == agl.Call.model_validate(good.model_dump())  # the unvalidated record is what validation gives
    assert (good.prompt_token_ids, good.completion_token_ids, good.token_source) == ([1, 2, 3], [7, 8], "response")
    reply.choices[0].token_ids.append(9)  # the response's own list is not the record's
    assert good.completion_token_ids == [7, 8]
    assert bad.output["content"] == "hi" and bad.completion_token_ids is None and bad.prompt_token_ids is None
    assert bad.token_source is None and bad.metadata["invalid_token_fields"] == ["completion_token_ids"]
    assert "malformed completion_token_ids" in caplog.text


_COMPARED = (
    "name",
    "input",
    "tools",
    "output",
    "response_id",
    "prompt_token_ids",
    "completion_token_ids",
    "completion_logprobs",
)


@pytest.mark.parametrize(
    "api", ["chat", "chat stream", "completions", "completions stream", "responses", "responses stream"]
)
def test_capture_and_proxy_read_the_same_call_alike(tmp_path: Path, api: str) -> None:
    """The same exchange, seen by capture (the response the agent got) and by the server's proxy (the upstream's
    bytes), gives the same Call fields: one reader of the wire format (the Responses API's finish_reason too)."""
    from agentlightning.server import LightningServer

    tools = [{"type": "function", "name": "run_sql", "parameters": {}}] if api.startswith("responses") else TOOLS
    replies = [MockReply(content="let me see", tool_calls=[MockToolCall("run_sql", {"q": "x"}, id="call_1")])]
    with (
        MockLLMServer(replies=replies) as mock,
        LightningServer(
            tmp_path / "store.db",
            upstream_url=mock.base_url,
            model_name="mock-model",
            model_version="v1",
            logprobs=True,
        ) as server,
    ):
        [rollout_id] = server.enqueue([{"q": "x"}])
        server.store.dequeue("worker", 30.0)
        client = openai.OpenAI(base_url=f"{server.url}/rollouts/{rollout_id}/v1", api_key="x", max_retries=0)
        stream = api.endswith("stream")
        recorder = RolloutRecorder(rollout_id)
        with recording(recorder):
            if api.startswith("chat"):
                reply = client.chat.completions.create(
                    model="m", messages=MESSAGES, tools=TOOLS, stream=stream, temperature=0.5
                )
            elif api.startswith("completions"):
                reply = client.completions.create(model="m", prompt="2+2=", stream=stream, temperature=0.5)
            else:
                reply = client.responses.create(
                    model="m", input="use a tool", tools=tools, stream=stream, temperature=0.5
                )
            if stream:
                list(reply)
        # the proxy records a call right after the agent got its answer: wait for that record
        deadline = time.monotonic() + 10
        while not server.store.proxy_calls(rollout_id) and time.monotonic() < deadline:
            time.sleep(0.01)
        [proxied] = server.store.proxy_calls(rollout_id)
    captured = only_call(recorder)
    assert captured.completion_token_ids and (captured.completion_logprobs or api.startswith("responses"))
    assert {name: getattr(captured, name) for name in _COMPARED} == {name: getattr(proxied, name) for name in _COMPARED}
    assert (captured.token_source, proxied.token_source) == ("response", "server")
    for key in ("usage", "stream", "sampling"):
        assert captured.metadata.get(key) == proxied.metadata.get(key), key
    if not api.startswith("completions"):
        assert captured.output["finish_reason"] == "tool_calls"
        assert captured.output["tool_calls"][0]["function"] == {"name": "run_sql", "arguments": '{"q": "x"}'}
