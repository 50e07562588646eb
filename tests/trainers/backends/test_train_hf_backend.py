"""The in-process Hugging Face backend with the real openai client on a tiny random model."""

from __future__ import annotations

import concurrent.futures
import json

import openai
import pytest
import torch
from agentlightning.trainers.backends.hf.server import HFBackendServer
from agentlightning.trainers.models import tiny_model

TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Compute",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}


@pytest.fixture(scope="module")
def served():
    model, tokenizer = tiny_model(seed=3)
    with HFBackendServer(model, tokenizer, model_version="v7", max_batch_size=16, batch_wait_s=0.05) as server:
        yield server, model, tokenizer


def _client(server: HFBackendServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)


def test_chat_returns_exact_token_ids_logprobs_and_version(served):
    server, model, tokenizer = served
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 3 + 4?"}]
    reply = (
        _client(server)
        .chat.completions.create(
            model="policy", messages=messages, tools=[TOOL], max_tokens=6, temperature=0.7, seed=1, logprobs=True
        )
        .model_dump()
    )
    expected_prompt = tokenizer.encode(
        tokenizer.apply_chat_template(messages, tools=[TOOL], tokenize=False, add_generation_prompt=True),
        add_special_tokens=False,
    )
    assert reply["prompt_token_ids"] == expected_prompt
    choice = reply["choices"][0]
    assert 1 <= len(choice["token_ids"]) <= 6
    assert reply["model_version"] == "v7"
    sampled = [entry["logprob"] for entry in choice["logprobs"]["content"]]
    assert len(sampled) == len(choice["token_ids"])
    # The logprobs are those of the sampling distribution (logits / temperature) of the served weights.
    ids = torch.tensor([expected_prompt + choice["token_ids"]])
    with torch.no_grad():
        logits = model(ids).logits[0, len(expected_prompt) - 1 : -1] / 0.7
    recomputed = torch.log_softmax(logits, -1).gather(1, torch.tensor(choice["token_ids"])[:, None]).squeeze(1)
    assert torch.allclose(recomputed, torch.tensor(sampled), atol=1e-4)


def test_same_seed_same_completion_and_greedy_is_deterministic(served):
    server, _, _ = served
    client = _client(server)
    ask = lambda **kw: client.chat.completions.create(  # noqa: E731
        model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=5, **kw
    ).model_dump()["choices"][0]["token_ids"]
    assert ask(seed=11, temperature=1.0) == ask(seed=11, temperature=1.0)
    assert ask(temperature=0) == ask(temperature=0)


def test_concurrent_requests_are_batched(served):
    server, _, _ = served
    client = _client(server)
    batches_before, rows_before = server.engine.batches_run, server.engine.rows_run
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        replies = list(
            pool.map(
                lambda i: client.chat.completions.create(
                    model="policy", messages=[{"role": "user", "content": f"q{i}"}], max_tokens=4, temperature=0
                ),
                range(8),
            )
        )
    assert len(replies) == 8
    assert server.engine.rows_run - rows_before == 8
    assert server.engine.batches_run - batches_before < 8


def test_batched_greedy_equals_single_greedy(served):
    server, _, _ = served
    client = _client(server)
    ask = lambda q: client.chat.completions.create(  # noqa: E731
        model="policy", messages=[{"role": "user", "content": q}], max_tokens=5, temperature=0
    ).model_dump()["choices"][0]["token_ids"]
    alone = ask("a much longer question about numbers")
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        together = list(pool.map(ask, ["x", "a much longer question about numbers", "yy", "z"]))
    assert together[1] == alone  # left padding and positions do not change the result


def test_stream_carries_token_ids(served):
    server, _, _ = served
    chunks = list(
        _client(server).chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True, temperature=0
        )
    )
    dumped = [chunk.model_dump() for chunk in chunks]
    assert dumped[0]["prompt_token_ids"]
    ids = [i for chunk in dumped for choice in chunk["choices"] for i in (choice.get("token_ids") or [])]
    assert len(ids) == 4
    assert dumped[-1]["usage"]["completion_tokens"] == 4


def test_completions_endpoint_accepts_token_ids(served):
    server, _, tokenizer = served
    prompt = tokenizer.encode("What is", add_special_tokens=False)
    reply = _client(server).completions.create(model="policy", prompt=prompt, max_tokens=3, temperature=0).model_dump()
    assert reply["prompt_token_ids"] == prompt and len(reply["choices"][0]["token_ids"]) == 3


def test_bad_requests_get_clear_400s(served):
    server, _, _ = served
    client = _client(server)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model="p", messages=[{"role": "user", "content": "hi"}], temperature=-1)
    with pytest.raises(openai.BadRequestError, match="messages"):
        client.chat.completions.create(model="p", messages=[])


def test_sampling_overrides_and_version_change(served):
    server, model, _ = served
    client = _client(server)
    server.sampling_overrides = {"temperature": 0.0}
    try:
        first = [
            client.chat.completions.create(
                model="p", messages=[{"role": "user", "content": "hi"}], max_tokens=5, temperature=1.5
            ).model_dump()["choices"][0]["token_ids"]
            for _ in range(2)
        ]
        assert first[0] == first[1]  # temperature forced to greedy
        with server.updating("v8"):
            pass
        assert (
            client.chat.completions.create(
                model="p", messages=[{"role": "user", "content": "hi"}], max_tokens=2
            ).model_dump()["model_version"]
            == "v8"
        )
    finally:
        server.sampling_overrides = {}
        with server.updating("v7"):
            pass


def test_max_tokens_limit_caps_what_a_request_asks(served):
    server, _, _ = served
    client = _client(server)
    server.max_tokens_limit = 3
    try:
        asked = [
            client.chat.completions.create(
                model="p", messages=[{"role": "user", "content": "hi"}], max_tokens=limit, temperature=1.0, seed=1
            ).model_dump()["choices"][0]
            for limit in (50, 2)
        ]
    finally:
        server.max_tokens_limit = None
    assert [len(choice["token_ids"]) for choice in asked] == [3, 2]  # the random tiny model never stops on its own
    assert asked[0]["finish_reason"] == "length"


def test_tool_calls_are_parsed_from_generated_text():
    from agentlightning.trainers.backends.hf.tool_calls import parse_tool_calls

    content, calls = parse_tool_calls(
        'Sure. <tool_call>{"name": "calculator", "arguments": {"expression": "1+2"}}</tool_call>'
    )
    assert content == "Sure."
    assert calls[0]["function"]["name"] == "calculator"
    assert json.loads(calls[0]["function"]["arguments"]) == {"expression": "1+2"}
    content, calls = parse_tool_calls('<tool_call>{"name": "calculator", "arguments": {"expression": "1+')
    assert calls == [] and content.startswith("<tool_call>")  # a broken call stays visible to the agent
    content, calls = parse_tool_calls('<tool_call>{"name": "f", "arguments": {}}')  # unterminated at the end
    assert content is None and calls[0]["function"]["name"] == "f"


def test_shared_prompt_prefix_is_computed_once_with_identical_results():
    from agentlightning.trainers.backends.hf.generation import GenerationEngine, SamplingParams, _shared_prefix

    model, tokenizer = tiny_model(seed=8)
    system = "You are a helpful assistant. Use the calculator tool to compute 12 * 5 - 8 / 2. " * 2
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "system", "content": system}, {"role": "user", "content": q}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for q in ("What is 3 + 4?", "Tom has 5 apples", "hi")
    ]
    ids = [tokenizer.encode(text, add_special_tokens=False) for text in prompts]
    assert _shared_prefix(ids) >= 32
    results = {}
    for sharing in (True, False):
        engine = GenerationEngine(model, tokenizer, max_batch_size=8, batch_wait_s=0.2, prefix_sharing=sharing)
        engine.start()
        try:
            futures = [engine.submit(row, SamplingParams(max_tokens=6, temperature=0)) for row in ids]
            results[sharing] = [future.result(timeout=60) for future in futures]
        finally:
            engine.stop()
        assert engine.batches_run == 1
    for shared, plain in zip(results[True], results[False], strict=True):
        assert shared.token_ids == plain.token_ids
        assert torch.allclose(torch.tensor(shared.logprobs), torch.tensor(plain.logprobs), atol=1e-4)
