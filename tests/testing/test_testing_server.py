"""The mock OpenAI-compatible server, driven by the real ``openai`` client over loopback HTTP."""

from __future__ import annotations

import threading
import time

import openai
import pytest

from agentlightning.testing import (
    MockLLMServer,
    MockReply,
    MockRequest,
    MockTokenizer,
    MockToolCall,
    render_chat_prompt,
)

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "héllo"}]


def client_for(server: MockLLMServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)


def test_tokenizer_round_trip_and_concatenation() -> None:
    tok = MockTokenizer()
    assert tok.decode(tok.encode("héllo wörld")) == "héllo wörld"
    assert tok.encode("ab") + tok.encode("c") == tok.encode("abc")
    assert min(tok.encode("\x00")) >= 3 and max(tok.encode("\xff")) < tok.vocab_size


def test_echo_default_and_requests_recorded(mock_llm_server: MockLLMServer) -> None:
    reply = client_for(mock_llm_server).chat.completions.create(model="m1", messages=MESSAGES)
    assert reply.choices[0].message.content == "echo: héllo"
    assert reply.choices[0].finish_reason == "stop"
    (request,) = mock_llm_server.requests
    assert request.path == "/v1/chat/completions" and request.model == "m1" and request.messages == MESSAGES


def test_scripted_replies_in_order_then_clear_error() -> None:
    with MockLLMServer(replies=["one", MockReply(content="two")]) as server:
        client = client_for(server)
        contents = [
            client.chat.completions.create(model="m", messages=MESSAGES).choices[0].message.content for _ in range(2)
        ]
        assert contents == ["one", "two"]
        with pytest.raises(openai.InternalServerError, match="no scripted reply left for request #2"):
            client.chat.completions.create(model="m", messages=MESSAGES)


def test_token_ids_and_logprobs_are_exact(mock_llm_server: MockLLMServer) -> None:
    mock_llm_server.set_replies(["SELECT 1"])
    tok = mock_llm_server.tokenizer
    reply = client_for(mock_llm_server).chat.completions.create(
        model="m", messages=MESSAGES, logprobs=True, extra_body={"return_token_ids": True}
    )
    assert reply.model_extra["prompt_token_ids"] == tok.encode(render_chat_prompt(MESSAGES))
    choice = reply.choices[0]
    assert choice.model_extra["token_ids"] == tok.encode("SELECT 1")
    assert [entry.logprob for entry in choice.logprobs.content] == [tok.logprob(i) for i in tok.encode("SELECT 1")]
    assert reply.usage.completion_tokens == len("SELECT 1")


def test_no_token_ids_unless_asked(mock_llm_server: MockLLMServer) -> None:
    reply = client_for(mock_llm_server).chat.completions.create(model="m", messages=MESSAGES)
    assert "prompt_token_ids" not in (reply.model_extra or {})
    assert reply.choices[0].logprobs is None


def test_tool_calls_non_stream_and_stream() -> None:
    call = MockToolCall(name="add", arguments={"a": 1, "b": 2})
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    with MockLLMServer(handler=lambda request: MockReply(tool_calls=[call]), token_ids=True) as server:
        client = client_for(server)
        reply = client.chat.completions.create(model="m", messages=MESSAGES, tools=tools)
        (tool_call,) = reply.choices[0].message.tool_calls
        assert (tool_call.function.name, tool_call.function.arguments) == ("add", '{"a": 1, "b": 2}')
        assert reply.choices[0].finish_reason == "tool_calls"
        assert server.requests[0].tools == tools
        assert reply.model_extra["prompt_token_ids"] == server.tokenizer.encode(render_chat_prompt(MESSAGES, tools))

        chunks = list(client.chat.completions.create(model="m", messages=MESSAGES, tools=tools, stream=True))
        arguments = "".join(tc.function.arguments or "" for c in chunks for tc in (c.choices[0].delta.tool_calls or []))
        assert arguments == '{"a": 1, "b": 2}'
        ids = [i for c in chunks for i in c.choices[0].model_extra["token_ids"]]
        assert ids == reply.choices[0].model_extra["token_ids"]


def test_streaming_content_usage_and_ids() -> None:
    with MockLLMServer(replies=["the quick brown fox"], token_ids=True) as server:
        stream = client_for(server).chat.completions.create(
            model="m", messages=MESSAGES, stream=True, logprobs=True, stream_options={"include_usage": True}
        )
        chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "the quick brown fox"
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) == 4
    assert chunks[0].model_extra["prompt_token_ids"] == server.tokenizer.encode(render_chat_prompt(MESSAGES))
    ids = [i for c in chunks if c.choices for i in c.choices[0].model_extra["token_ids"]]
    assert ids == server.tokenizer.encode(text)
    assert chunks[-1].usage.completion_tokens == len(ids)


def test_completions_responses_and_models() -> None:
    with MockLLMServer(handler=lambda request: f"re: {request.last_user_text}", models=["a", "b"]) as server:
        client = client_for(server)
        legacy = client.completions.create(model="a", prompt="2+2=", extra_body={"return_token_ids": True})
        assert legacy.choices[0].text == "re: 2+2="
        assert legacy.choices[0].model_extra["prompt_token_ids"] == server.tokenizer.encode("2+2=")
        response = client.responses.create(model="a", input="hi there", instructions="sys")
        assert response.output_text == "re: hi there"
        assert server.requests[-1].messages == [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "hi there"},
        ]
        with client.responses.stream(model="a", input="streamed") as stream:
            final = stream.get_final_response()
        assert final.output_text == "re: streamed"
        assert [model.id for model in client.models.list()] == ["a", "b"]


def test_responses_function_call_items_normalised() -> None:
    request = MockRequest(
        path="/v1/responses",
        body={
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "add"}]},
                {"type": "function_call", "call_id": "c1", "name": "add", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "3"},
            ]
        },
    )
    assert [m["role"] for m in request.messages] == ["user", "assistant", "tool"]
    assert request.messages[1]["tool_calls"][0]["function"]["name"] == "add"


@pytest.mark.parametrize(("status", "error"), [(500, openai.InternalServerError), (429, openai.RateLimitError)])
def test_injected_errors(status: int, error: type[Exception]) -> None:
    with MockLLMServer(replies=[MockReply(status=status, error_message="boom")]) as server:
        with pytest.raises(error, match="boom"):
            client_for(server).chat.completions.create(model="m", messages=MESSAGES)


def test_latency_and_hang_released_on_stop() -> None:
    with MockLLMServer(replies=[MockReply(content="slow", latency=0.2), MockReply(hang=True)]) as server:
        client = client_for(server)
        started = time.perf_counter()
        client.chat.completions.create(model="m", messages=MESSAGES)
        assert time.perf_counter() - started >= 0.2
        with pytest.raises(openai.APITimeoutError):
            client.with_options(timeout=0.2).chat.completions.create(model="m", messages=MESSAGES)
    started = time.perf_counter()
    server.stop()  # idempotent
    assert time.perf_counter() - started < 1


def test_handler_errors_and_bad_replies_are_reported() -> None:
    def broken(request: MockRequest) -> MockReply:
        raise KeyError("nope")

    with MockLLMServer(handler=broken) as server:
        with pytest.raises(openai.InternalServerError, match="handler raised KeyError"):
            client_for(server).chat.completions.create(model="m", messages=MESSAGES)
    with pytest.raises(TypeError, match="must be a MockReply or str, got int 3"):
        MockLLMServer(replies=[3])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="either handler= or replies="):
        MockLLMServer(handler=broken, replies=[])


async def test_async_handler_and_concurrent_requests() -> None:
    async def handler(request: MockRequest) -> MockReply:
        return MockReply(content=request.last_user_text.upper(), latency=0.1)

    with MockLLMServer(handler=handler) as server:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        import asyncio

        started = time.perf_counter()
        replies = await asyncio.gather(
            *[
                client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"q{i}"}])
                for i in range(20)
            ]
        )
        elapsed = time.perf_counter() - started
        await client.close()
    assert [r.choices[0].message.content for r in replies] == [f"Q{i}" for i in range(20)]
    assert elapsed < 1.5  # latencies overlap: requests are served concurrently


def test_thread_safe_request_log() -> None:
    with MockLLMServer() as server:
        client = client_for(server)
        threads = [
            threading.Thread(
                target=lambda i=i: client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": str(i)}]
                )
            )
            for i in range(10)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(r.last_user_text for r in server.requests) == sorted(str(i) for i in range(10))


def test_command_line_server() -> None:
    import signal
    import subprocess
    import sys

    command = [sys.executable, "-m", "agentlightning.testing", "--reply", "from the shell", "--reply", "again"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stderr.readline()
        base_url = line.split(" at ")[1].split()[0]
        client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
        # Issue 35: `--reply X` answered once, then 500 to every request of a training run; it now goes round.
        replies = [client.chat.completions.create(model="m", messages=MESSAGES) for _ in range(5)]
        assert [r.choices[0].message.content for r in replies] == ["from the shell", "again"] * 2 + ["from the shell"]
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=20) == 0
