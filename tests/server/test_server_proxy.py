"""The per-rollout proxy: token ids recorded from the upstream, streaming, retries, refusals, joins."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import openai
import pytest
from polling import wait_for
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

import agentlightning as agl
from agentlightning._uvicorn import BackgroundServer
from agentlightning._wire.messages import media_size
from agentlightning._wire.read import json_text
from agentlightning.server import LightningServer, Settings
from agentlightning.server._proxy import _upstream_body
from agentlightning.server._runtime import Upstream
from agentlightning.testing import MockLLMServer, MockReply, MockToolCall
from agentlightning.types import Rollout


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


def _running(server: LightningServer, task: dict | None = None) -> tuple[str, str]:
    [rid] = server.enqueue([task or {"q": "x"}])
    lease = server.store.dequeue("test-worker", 30.0)
    assert lease.rollout_id == rid
    return rid, f"{server.url}/rollouts/{rid}/v1"


def _finish(server: LightningServer, rid: str, rollout: Rollout | None = None) -> Rollout:
    result = rollout or Rollout(rollout_id=rid, status="succeeded", final_reward=1.0)
    response = httpx.post(
        f"{server.url}/rollouts/{rid}/result",
        json={"attempt": 1, "worker_id": "test-worker", "rollout": result.model_dump(mode="json")},
    )
    assert response.status_code == 200, response.text
    [done] = server.wait([rid], timeout=5)
    return done


def test_chat_calls_recorded_with_exact_token_ids(server: LightningServer, mock: MockLLMServer) -> None:
    rid, base_url = _running(server)
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    reply = client.chat.completions.create(
        model="whatever", messages=[{"role": "user", "content": "hi"}], temperature=0.5
    )
    assert reply.choices[0].message.content == "echo: hi"
    sent = mock.requests[-1].body
    assert sent["return_token_ids"] is True and sent["model"] == "mock-model"
    [call] = _finish(server, rid).calls
    assert call.token_source == "server" and call.metadata["model_version"] == "v3"
    assert call.completion_token_ids == mock.tokenizer.encode("echo: hi")
    assert call.prompt_token_ids == reply.model_extra["prompt_token_ids"]
    assert call.response_id == reply.id and call.input == [{"role": "user", "content": "hi"}]
    assert call.metadata["sampling"] == {"temperature": 0.5}


def test_stream_passed_through_and_recorded(server: LightningServer, mock: MockLLMServer) -> None:
    mock.set_replies(
        [
            MockReply(content="streamed answer here"),
            MockReply(tool_calls=[MockToolCall(name="add", arguments={"a": 1, "b": 2})]),
        ]
    )
    rid, base_url = _running(server)
    client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
    chunks = list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "go"}], stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "streamed answer here" and len(chunks) > 2
    tool_chunks = list(
        client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "add"}],
            stream=True,
            tools=[{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}],
        )
    )
    assert tool_chunks
    first, second = _finish(server, rid).calls
    assert first.output["content"] == "streamed answer here" and first.metadata["stream"] is True
    assert first.completion_token_ids == mock.tokenizer.encode("streamed answer here")
    assert first.prompt_token_ids and first.token_source == "server"
    [tool] = second.output["tool_calls"]
    assert tool["function"]["name"] == "add" and json.loads(tool["function"]["arguments"]) == {"a": 1, "b": 2}
    assert second.tools[0]["function"]["name"] == "add"


def test_completions_and_responses_endpoints(server: LightningServer, mock: MockLLMServer) -> None:
    server.set_upstream(mock.base_url, "mock-model", "v4", logprobs=True)
    rid, base_url = _running(server)
    client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
    completion = client.completions.create(model="m", prompt="Say: ok")
    assert completion.choices[0].text
    response = client.responses.create(model="m", input="question?", instructions="be brief")
    assert response.output_text == "echo: question?"
    streamed = list(client.responses.create(model="m", input="again", stream=True))
    assert streamed[-1].type == "response.completed"
    legacy, resp, resp_stream = _finish(server, rid).calls
    assert legacy.metadata["endpoint"] == "completions" and legacy.completion_token_ids
    assert legacy.completion_logprobs and len(legacy.completion_logprobs) == len(legacy.completion_token_ids)
    assert resp.output["content"] == "echo: question?" and resp.input[0] == {"role": "system", "content": "be brief"}
    assert resp.completion_token_ids == mock.tokenizer.encode("echo: question?")
    assert resp_stream.output["content"] == "echo: again" and resp_stream.prompt_token_ids
    assert {c.metadata["model_version"] for c in (legacy, resp, resp_stream)} == {"v4"}


def test_logprobs_requested_when_training_wants_them(server: LightningServer, mock: MockLLMServer) -> None:
    server.set_upstream(mock.base_url, "mock-model", "v5", logprobs=True)
    rid, base_url = _running(server)
    client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert mock.requests[-1].body["logprobs"] is True
    [call] = _finish(server, rid).calls
    assert call.completion_logprobs is not None and len(call.completion_logprobs) == len(call.completion_token_ids)


def test_unknown_finished_and_queued_rollouts_are_refused(server: LightningServer) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/rollouts/ro-nope/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError, match="unknown rollout 'ro-nope'"):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    [queued] = server.enqueue([{"q": 1}])
    queued_client = openai.OpenAI(base_url=f"{server.url}/rollouts/{queued}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.ConflictError, match="is queued, not running"):
        queued_client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    server.store.cancel(queued)
    with pytest.raises(openai.ConflictError, match="is cancelled"):
        queued_client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    rid, base_url = _running(server)
    _finish(server, rid)
    with pytest.raises(openai.ConflictError, match="is succeeded, not running"):
        openai.OpenAI(base_url=base_url, api_key="x", max_retries=0).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "late"}]
        )
    response = httpx.post(f"{base_url}/embeddings", json={"input": "x"})
    assert response.status_code == 404 and "unknown endpoint" in response.json()["error"]["message"]


def test_an_attempts_endpoint_serves_it_while_its_result_may_still_be_taken(server: LightningServer) -> None:
    """Issue 36, defect 2: each call is recorded under the attempt its URL names, not the rollout's current one."""
    [rid] = server.enqueue([{"q": "x"}])
    assert server.store.dequeue("worker-1", 30.0).llm is None  # (the store's lease; the HTTP one names the attempt)

    def ask(attempt: int) -> str:
        client = openai.OpenAI(
            base_url=f"{server.url}/rollouts/{rid}/attempts/{attempt}/v1", api_key="x", max_retries=0
        )
        reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"from {attempt}"}])
        return reply.choices[0].message.content.removeprefix("echo: ")

    assert ask(1) == "from 1"
    with pytest.raises(openai.ConflictError, match="attempt 2 of rollout .* was never leased"):
        ask(2)
    server.store.expire_leases(now=time.time() + 60)  # attempt 1's worker stopped heart-beating
    with pytest.raises(openai.ConflictError, match="is queued, not running"):  # the running attempt's URL
        openai.OpenAI(base_url=f"{server.url}/rollouts/{rid}/v1", api_key="x", max_retries=0).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "current"}]
        )
    assert ask(1) == "from 1"  # its lease expired, but a late success from it would still be taken
    assert wait_for(lambda: server.store.dequeue("worker-2", 30.0), 10, "the re-lease delay").attempt == 2
    assert (ask(2), ask(1)) == ("from 2", "from 1")
    assert [len(server.store.proxy_calls(rid, n)) for n in (1, 2)] == [3, 1]
    failed = Rollout(rollout_id=rid, status="failed")
    stale = {"attempt": 1, "worker_id": "worker-1", "rollout": failed.model_dump(mode="json")}
    assert httpx.post(f"{server.url}/rollouts/{rid}/result", json=stale).json()["accepted"] is False
    with pytest.raises(openai.ConflictError, match=r"attempt 1 of rollout .* ended \(failed\)"):
        ask(1)
    for attempt in (0, 10**20):
        answer = httpx.post(f"{server.url}/rollouts/{rid}/attempts/{attempt}/v1/chat/completions", json={})
        assert answer.status_code == 422 and "attempt" in answer.text


def test_upstream_errors_retried_then_reported_faithfully(
    server: LightningServer, mock: MockLLMServer, caplog: pytest.LogCaptureFixture
) -> None:
    mock.set_replies(
        [
            MockReply(status=500),
            MockReply(status=429),
            MockReply(content="third time lucky"),
            MockReply(status=503),
            MockReply(content="stream ok"),
            *[MockReply(status=500, error_message="model exploded")] * 200,
        ]
    )
    rid, base_url = _running(server)
    client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
    reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content == "third time lucky"
    chunks = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "s"}], stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "stream ok"
    with pytest.raises(openai.InternalServerError, match="model exploded"):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "doomed"}])
    doomed = len(mock.requests) - 5  # retried for the retry window (1 s here), then the last answer passed on
    assert 5 <= doomed < 200
    metrics = httpx.get(f"{server.url}/metrics").text
    assert f'agl_proxy_upstream_retries_total{{endpoint="chat.completions",reason="500"}} {doomed}' in metrics
    assert 'reason="429"} 1' in metrics and 'reason="503"} 1' in metrics
    ok, streamed, failed = _finish(server, rid).calls
    assert ok.status == "ok" and ok.metadata["upstream_tries"] == 3 and streamed.status == "ok"
    assert failed.status == "error" and "model exploded" in failed.error
    retries = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
    assert any("upstream answered 500 (model exploded) on chat.completions" in line for line in retries), retries


def test_a_prompt_over_the_limit_is_refused_before_it_goes_upstream_and_inline_media_does_not_count(
    tmp_path: Path, mock: MockLLMServer
) -> None:
    """Issue 36: the server's work on a call grows with its token ids (a 20 MB prompt held /health for seconds), so a
    proxied request with more text than ``Settings.max_prompt_bytes`` gets a 413 naming the setting; inline image and
    audio data (a few hundred tokens each to the model) does not count."""
    with LightningServer(
        tmp_path / "s.db", upstream_url=mock.base_url, settings=Settings(max_prompt_bytes=100_000)
    ) as server:
        rid, base_url = _running(server)
        client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
        with pytest.raises(openai.APIStatusError) as refused:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x" * 150_000}])
        assert refused.value.status_code == 413
        message = refused.value.response.json()["error"]["message"]
        assert "bytes of text (image and audio data not counted)" in message, message
        assert "limit of 100000 bytes (Settings.max_prompt_bytes, agl server --max-prompt-mb)" in message, message
        assert mock.requests == []
        image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 300_000}}
        audio = {"type": "input_audio", "input_audio": {"data": "B" * 300_000, "format": "wav"}}
        parts = [{"type": "text", "text": "what is in this picture and this sound?"}, image, audio]
        reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": parts}])
        assert reply.choices[0].message.content
        assert len(mock.requests) == 1
        [call] = _finish(server, rid).calls
        assert call.status == "ok" and call.input[0]["content"][1] == image


def test_media_size_counts_inline_image_and_audio_data_of_each_api() -> None:
    text = {"type": "text", "text": "data: not an image, since it does not start the string" * 3}
    chat_image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    chat_audio = {"type": "input_audio", "input_audio": {"data": "BBBBBB", "format": "wav"}}
    responses_image = {"type": "input_image", "image_url": "data:image/jpeg;base64,CC"}
    anthropic_image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "DDD"}}
    plain_data = {"type": "text", "data": "a tool's own field called data"}
    body = {"messages": [{"role": "user", "content": [text, chat_image, chat_audio, responses_image, plain_data]}]}
    body["input"] = [{"role": "user", "content": [anthropic_image]}]
    expected = len("data:image/png;base64,AAAA") + 6 + len("data:image/jpeg;base64,CC") + 3
    assert media_size(body) == expected


def test_unreachable_upstream_gives_502(server: LightningServer) -> None:
    with MockLLMServer() as gone:
        dead_url = gone.base_url
    server.set_upstream(dead_url, "m", "v9")
    rid, base_url = _running(server)
    client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
    with pytest.raises(openai.APIStatusError, match=r"unreachable for 1 s \(\d+ tries\)") as info:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == 502
    [call] = _finish(server, rid).calls
    assert call.status == "error" and "ConnectError" in call.error


def test_client_errors_passed_through_without_retry(server: LightningServer, mock: MockLLMServer) -> None:
    mock.set_replies([MockReply(status=400, error_message="prompt too long"), MockReply(status=400)])
    rid, base_url = _running(server)
    client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="prompt too long"):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True)
    assert len(mock.requests) == 2
    plain, streamed = _finish(server, rid).calls
    assert plain.status == "error" and plain.error == "upstream HTTP 400: prompt too long"
    assert streamed.status == "error" and plain.metadata["upstream_tries"] == 1


class _DropFirstConnection:
    """A TCP relay to ``port`` that reads the first request it gets and closes that connection unanswered."""

    def __init__(self, port: int) -> None:
        self.port, self._listener = port, socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}/v1"

    def _accept(self) -> None:
        dropped = False
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self._listener.accept()
                if not dropped:
                    dropped = True
                    conn.recv(65536)
                    conn.close()
                    continue
                target = socket.create_connection(("127.0.0.1", self.port))
                for source, sink in ((conn, target), (target, conn)):
                    threading.Thread(target=_pump, args=(source, sink), daemon=True).start()

    def close(self) -> None:
        self._listener.close()


class _ForwardProxy:
    """A forward HTTP proxy to ``port``: requests arrive with an absolute URL (``POST http://host/path``), and reach
    the mock in origin form (``POST /path``), as a real proxy would send them on; the absolute URLs are kept."""

    def __init__(self, port: int) -> None:
        self.port, self._listener = port, socket.create_server(("127.0.0.1", 0))
        self.targets: list[str] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self._listener.accept()
                head = b""
                while b"\r\n" not in head:
                    head += conn.recv(65536)
                line, rest = head.split(b"\r\n", 1)
                method, target, version = line.split(b" ")
                self.targets.append(target.decode())
                path = b"/" + target.split(b"://", 1)[1].split(b"/", 1)[1]
                upstream = socket.create_connection(("127.0.0.1", self.port))
                upstream.sendall(b" ".join((method, path, version)) + b"\r\n" + rest)
                for source, sink in ((conn, upstream), (upstream, conn)):
                    threading.Thread(target=_pump, args=(source, sink), daemon=True).start()

    def close(self) -> None:
        self._listener.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)


def test_connection_closed_before_the_answer_is_retried(server: LightningServer, mock: MockLLMServer) -> None:
    relay = _DropFirstConnection(mock.port)
    try:
        server.set_upstream(relay.url, "mock-model", "v6")
        rid, base_url = _running(server)
        client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
        reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "again"}])
        assert reply.choices[0].message.content == "echo: again"
        [call] = _finish(server, rid).calls
        assert call.status == "ok" and call.metadata["upstream_tries"] == 2
    finally:
        relay.close()
    # httpx names a connection closed without an answer RemoteProtocolError, or ReadError when the close races the read
    assert re.search(
        r'agl_proxy_upstream_retries_total\{endpoint="chat.completions",reason="(RemoteProtocolError|ReadError)"\} 1',
        httpx.get(f"{server.url}/metrics").text,
    )


def test_stream_chunks_reach_the_agent_as_the_upstream_sends_them(server: LightningServer) -> None:
    gate = threading.Event()  # the upstream holds the rest of its stream until the agent saw the first chunk

    async def events() -> AsyncIterator[bytes]:
        yield b'data: {"id": "c1", "choices": [{"index": 0, "delta": {"content": "Hel"}}]}\n\n'
        await asyncio.to_thread(gate.wait, 10)
        yield b'data: {"id": "c1", "choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop"}]}\n\n'
        yield b"data: [DONE]\n\n"

    async def chat(_request: Request) -> StreamingResponse:
        return StreamingResponse(events(), media_type="text/event-stream")

    upstream = BackgroundServer(Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])).start()
    try:
        server.set_upstream(f"{upstream.url}/v1", "gated", "v7")
        rid, base_url = _running(server)
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        with httpx.stream("POST", f"{base_url}/chat/completions", json=body, timeout=5) as response:
            chunks = response.iter_raw()
            assert b'"Hel"' in next(chunks) and not gate.is_set()
            gate.set()
            assert b'"lo"' in b"".join(chunks)
        [call] = _finish(server, rid).calls
        assert call.status == "ok" and call.output["content"] == "Hello" and call.output["finish_reason"] == "stop"
    finally:
        gate.set()
        upstream.stop()


def test_a_stream_that_ends_without_a_finish_reason_is_recorded_as_cut(server: LightningServer) -> None:
    async def events() -> AsyncIterator[bytes]:  # an upstream that stops mid-answer: no finish_reason, no [DONE]
        yield b'data: {"id": "c1", "choices": [{"index": 0, "delta": {"content": "The answer is"}}]}\n\n'

    async def chat(_request: Request) -> StreamingResponse:
        return StreamingResponse(events(), media_type="text/event-stream")

    upstream = BackgroundServer(Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])).start()
    try:
        server.set_upstream(f"{upstream.url}/v1", "cut", "v8")
        rid, base_url = _running(server)
        client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
        chunks = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "The answer is"
        [call] = _finish(server, rid).calls
        assert call.status == "error" and "interrupted" in (call.error or "")
        assert call.output["content"] == "The answer is" and call.output["finish_reason"] == "incomplete_stream"
    finally:
        upstream.stop()


def test_upstream_reached_through_the_environment_proxy(
    tmp_path: Path, mock: MockLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("HTTPS_PROXY", "ALL_PROXY", "https_proxy", "all_proxy", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    forward = _ForwardProxy(mock.port)
    monkeypatch.setenv("HTTP_PROXY", forward.url)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    try:
        with LightningServer(tmp_path / "p.db", upstream_url="http://llm.internal:8000/v1", model_name="m") as server:
            rid, base_url = _running(server)
            body = {"model": "m", "messages": [{"role": "user", "content": "via proxy"}]}
            answer = httpx.post(f"{base_url}/chat/completions", json=body, trust_env=False, timeout=10)
            assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"] == "echo: via proxy"
            assert forward.targets == ["http://llm.internal:8000/v1/chat/completions"]
            assert mock.requests[-1].headers["host"] == "llm.internal:8000"
    finally:
        forward.close()


def test_silent_upstream_times_out_with_504(tmp_path: Path, mock: MockLLMServer) -> None:
    mock.set_replies([MockReply(hang=True)])
    settings = Settings(upstream_timeout=0.3)
    with LightningServer(tmp_path / "t.db", upstream_url=mock.base_url, model_name="m", settings=settings) as server:
        rid, base_url = _running(server)
        client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
        with pytest.raises(openai.APIStatusError, match="did not answer within 0.3 s") as info:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hello?"}])
        assert info.value.status_code == 504 and len(mock.requests) == 1  # a timeout is not retried
        [call] = _finish(server, rid).calls
        assert call.status == "error" and "ReadTimeout" in call.error


@agl.rollout(roles=["writer"])
def _unused(task, llm):  # noqa: ANN001, ANN202 - only here so the module imports agl's decorator like users do
    return 0.0


def test_client_calls_joined_with_proxy_records(server: LightningServer, mock: MockLLMServer) -> None:
    """A captured agent run (roles from agl.role, client-side records) gets the proxy's token ids and version."""
    rid, base_url = _running(server, {"id": "t1", "q": "x"})

    @agl.rollout(roles=["writer"])
    def agent(task: dict, llm: agl.LLM) -> float:
        client = openai.OpenAI(base_url=llm.base_url, api_key="x", max_retries=0)
        with agl.role("writer"):
            client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": "one"}])
        with agl.role("critic"):
            client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": "two"}])
        return 0.5

    llm = agl.LLM(base_url=base_url, model="mock-model", model_version="v3")
    result = agent.execute({"id": "t1", "q": "x"}, llm, rollout_id=rid)
    assert [c.role for c in result.llm_calls] == ["writer", "critic"]
    done = _finish(server, rid, result)
    writer, critic = done.llm_calls
    assert (writer.role, critic.role) == ("writer", "critic")
    assert writer.token_source == critic.token_source == "server"
    assert writer.completion_token_ids == mock.tokenizer.encode("echo: one")
    assert critic.completion_token_ids == mock.tokenizer.encode("echo: two")
    assert "proxy_call_id" in writer.metadata and done.final_reward == 0.5


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "m", "messages": [{"role": "user", "content": "caf\\u00e9 \xc3\xa9"}]}',
        b' {"messages": []} \n',
        b'{"model": "other"}',
        b"{}",
        b'{"model": "m", "return_token_ids": 1}',
        b'{"model": "m", "return_token_ids": true}',
        b'{"model": "m", "logprobs": 0}',
        '{"model": "m"}'.encode("utf-16"),
    ],
)
@pytest.mark.parametrize("logprobs", [False, True])
@pytest.mark.parametrize("endpoint", ["chat.completions", "completions"])
def test_upstream_body_sets_model_token_ids_and_logprobs(raw: bytes, logprobs: bool, endpoint: str) -> None:
    """The upstream gets the agent's request with the served model, token ids and (when training) logprobs."""
    body = json.loads(raw)
    upstream = Upstream(url="http://u/v1", model_name="m", logprobs=logprobs)
    sent = json.loads(json.dumps(_upstream_body(body, endpoint, upstream)))
    expected = {**body, "model": "m", "return_token_ids": True}
    if logprobs and endpoint == "chat.completions":
        expected["logprobs"] = True
    elif logprobs and not body.get("logprobs"):
        expected["logprobs"] = 1
    assert sent == expected and [type(sent[k]) for k in expected] == [type(v) for v in expected.values()]


def test_json_text_writes_what_json_does() -> None:
    assert json.loads(json_text({"ids": [1, 2], "x": None, "lone": "\ud800"})) == {
        "ids": [1, 2],
        "x": None,
        "lone": "\ud800",
    }
