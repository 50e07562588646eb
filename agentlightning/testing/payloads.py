"""OpenAI-format response bodies (and vLLM token-id extensions) for the mock server."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from agentlightning.testing.replies import MockReply
from agentlightning.testing.tokenizer import MockTokenizer, render_tool_calls


@dataclass
class Generation:
    """Everything one reply produces: texts and token ids of prompt and completion."""

    reply: MockReply
    prompt_ids: list[int]
    completion_text: str
    completion_ids: list[int]
    with_token_ids: bool
    with_logprobs: bool
    top_logprobs: int


def completion_text(reply: MockReply) -> str:
    """The text the completion's token ids stand for: content, then rendered tool calls."""
    tool_calls = [{"name": call.name, "arguments": call.arguments_json()} for call in reply.tool_calls]
    return (reply.content or "") + render_tool_calls(tool_calls)


def _new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def _body(response_id: str, kind: str, created: int, model: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
    """The envelope every chat / completions body and chunk shares."""
    return {"id": response_id, "object": kind, "created": created, "model": model, "choices": choices}


def usage(gen: Generation) -> dict[str, Any]:
    """Chat / completions ``usage`` block."""
    prompt, completion = len(gen.prompt_ids), len(gen.completion_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def chat_logprobs(tokenizer: MockTokenizer, ids: list[int], top: int) -> dict[str, Any]:
    """Chat ``choices[i].logprobs`` for ``ids``."""
    content = []
    for token_id in ids:
        entry = {
            "token": tokenizer.token_text(token_id),
            "logprob": tokenizer.logprob(token_id),
            "bytes": list(tokenizer.token_bytes(token_id)),
        }
        content.append({**entry, "top_logprobs": [entry] if top > 0 else []})
    return {"content": content, "refusal": None}


def _tool_calls(reply: MockReply) -> list[dict[str, Any]]:
    return [
        {"id": call.call_id(), "type": "function", "function": {"name": call.name, "arguments": call.arguments_json()}}
        for call in reply.tool_calls
    ]


def chat_completion(gen: Generation, model: str, n: int, tokenizer: MockTokenizer) -> dict[str, Any]:
    """A non-streaming ``chat.completion`` body."""
    reply = gen.reply
    message: dict[str, Any] = {"role": "assistant", "content": reply.content, "refusal": None}
    if reply.tool_calls:
        message["tool_calls"] = _tool_calls(reply)
    choices = []
    for index in range(n):
        choice: dict[str, Any] = {
            "index": index,
            "message": message,
            "finish_reason": reply.resolved_finish_reason(),
            "logprobs": chat_logprobs(tokenizer, gen.completion_ids, gen.top_logprobs) if gen.with_logprobs else None,
        }
        if gen.with_token_ids:
            choice["token_ids"] = gen.completion_ids
        choices.append(choice)
    body = _body(_new_id("chatcmpl-"), "chat.completion", int(time.time()), model, choices)
    body["usage"] = usage(gen)
    if gen.with_token_ids:
        body["prompt_token_ids"] = gen.prompt_ids
    return body


def _pieces(text: str) -> list[str]:
    """Split text into stream deltas (a word with its leading whitespace each)."""
    return re.findall(r"\s*\S+|\s+", text)


def chat_chunks(
    gen: Generation, model: str, tokenizer: MockTokenizer, include_usage: bool
) -> Iterator[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of a streamed reply (token ids on the chunks, as vLLM does)."""
    reply = gen.reply
    response_id, created = _new_id("chatcmpl-"), int(time.time())

    def chunk(delta: dict[str, Any], ids: list[int] | None = None, finish: str | None = None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        if ids is not None and gen.with_logprobs:
            choice["logprobs"] = chat_logprobs(tokenizer, ids, gen.top_logprobs)
        if gen.with_token_ids:
            choice["token_ids"] = ids or []
        return _body(response_id, "chat.completion.chunk", created, model, [choice])

    first = chunk({"role": "assistant", "content": ""})
    if gen.with_token_ids:
        first["prompt_token_ids"] = gen.prompt_ids
    yield first
    for piece in _pieces(reply.content or ""):
        yield chunk({"content": piece}, tokenizer.encode(piece))
    for index, call in enumerate(reply.tool_calls):
        text = render_tool_calls([{"name": call.name, "arguments": call.arguments_json()}])
        header = {"index": index, "id": call.call_id(), "type": "function",
                  "function": {"name": call.name, "arguments": ""}}
        yield chunk({"tool_calls": [header]}, [])
        yield chunk({"tool_calls": [{"index": index, "function": {"arguments": call.arguments_json()}}]},
                    tokenizer.encode(text))
    yield chunk({}, [], finish=reply.resolved_finish_reason())
    if include_usage:
        yield {**_body(response_id, "chat.completion.chunk", created, model, []), "usage": usage(gen)}


def completion_logprobs(tokenizer: MockTokenizer, ids: list[int], offset: int = 0) -> dict[str, Any]:
    """Legacy completions ``choices[i].logprobs``."""
    tokens = [tokenizer.token_text(i) for i in ids]
    offsets, position = [], offset
    for token in tokens:
        offsets.append(position)
        position += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": [tokenizer.logprob(i) for i in ids],
        "top_logprobs": [{t: tokenizer.logprob(i)} for t, i in zip(tokens, ids, strict=True)],
        "text_offset": offsets,
    }


def completion(gen: Generation, model: str, tokenizer: MockTokenizer) -> dict[str, Any]:
    """A legacy ``text_completion`` body (vLLM puts ``prompt_token_ids`` on the choice; we also set it on top)."""
    choice: dict[str, Any] = {
        "index": 0,
        "text": gen.completion_text,
        "finish_reason": gen.reply.resolved_finish_reason(),
        "logprobs": completion_logprobs(tokenizer, gen.completion_ids) if gen.with_logprobs else None,
    }
    body = _body(_new_id("cmpl-"), "text_completion", int(time.time()), model, [choice])
    body["usage"] = usage(gen)
    if gen.with_token_ids:
        choice["token_ids"] = gen.completion_ids
        choice["prompt_token_ids"] = gen.prompt_ids
        body["prompt_token_ids"] = gen.prompt_ids
    return body


def completion_chunks(gen: Generation, model: str, tokenizer: MockTokenizer) -> Iterator[dict[str, Any]]:
    """Streamed legacy completion chunks."""
    response_id, created = _new_id("cmpl-"), int(time.time())
    pieces = _pieces(gen.completion_text)
    for index, piece in enumerate(pieces):
        ids = tokenizer.encode(piece)
        choice: dict[str, Any] = {"index": 0, "text": piece, "finish_reason": None,
                                  "logprobs": completion_logprobs(tokenizer, ids) if gen.with_logprobs else None}
        body = _body(response_id, "text_completion", created, model, [choice])
        if gen.with_token_ids:
            choice["token_ids"] = ids
            if index == 0:
                choice["prompt_token_ids"] = gen.prompt_ids
                body["prompt_token_ids"] = gen.prompt_ids
        yield body
    last = {"index": 0, "text": "", "finish_reason": gen.reply.resolved_finish_reason(), "logprobs": None}
    yield _body(response_id, "text_completion", created, model, [last])


def response_object(gen: Generation, model: str, status: str = "completed") -> dict[str, Any]:
    """A Responses API ``response`` object (with vLLM-style ``prompt_token_ids`` / ``output_token_ids``)."""
    reply = gen.reply
    output: list[dict[str, Any]] = []
    if reply.content is not None and status == "completed":
        output.append({
            "type": "message",
            "id": _new_id("msg_"),
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": reply.content, "annotations": []}],
        })
    if status == "completed":
        for call in reply.tool_calls:
            output.append({
                "type": "function_call",
                "id": _new_id("fc_"),
                "call_id": call.call_id(),
                "name": call.name,
                "arguments": call.arguments_json(),
                "status": "completed",
            })
    prompt, completion_tokens = len(gen.prompt_ids), len(gen.completion_ids)
    body: dict[str, Any] = {
        "id": _new_id("resp_"),
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "status": status,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": prompt,
            "output_tokens": completion_tokens,
            "total_tokens": prompt + completion_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        } if status == "completed" else None,
    }
    if gen.with_token_ids:
        body["prompt_token_ids"] = gen.prompt_ids
        if status == "completed":
            body["output_token_ids"] = gen.completion_ids
    return body


def response_events(gen: Generation, model: str) -> Iterator[dict[str, Any]]:
    """The server-sent events of a streamed Responses API reply."""
    sequence = 0

    def event(kind: str, **fields: Any) -> dict[str, Any]:
        nonlocal sequence
        sequence += 1
        return {"type": kind, "sequence_number": sequence - 1, **fields}

    final = response_object(gen, model)
    pending = {**final, "status": "in_progress", "output": [], "usage": None}
    pending.pop("output_token_ids", None)
    yield event("response.created", response=pending)
    yield event("response.in_progress", response=pending)
    for index, item in enumerate(final["output"]):
        if item["type"] == "message":
            text = item["content"][0]["text"]
            yield event("response.output_item.added", output_index=index,
                        item={**item, "status": "in_progress", "content": []})
            yield event("response.content_part.added", output_index=index, item_id=item["id"], content_index=0,
                        part={"type": "output_text", "text": "", "annotations": []})
            for piece in _pieces(text):
                yield event("response.output_text.delta", output_index=index, item_id=item["id"], content_index=0,
                            delta=piece, logprobs=[])
            yield event("response.output_text.done", output_index=index, item_id=item["id"], content_index=0,
                        text=text, logprobs=[])
            yield event("response.content_part.done", output_index=index, item_id=item["id"], content_index=0,
                        part=item["content"][0])
        else:
            yield event("response.output_item.added", output_index=index,
                        item={**item, "status": "in_progress", "arguments": ""})
            yield event("response.function_call_arguments.delta", output_index=index, item_id=item["id"],
                        delta=item["arguments"])
            yield event("response.function_call_arguments.done", output_index=index, item_id=item["id"],
                        arguments=item["arguments"], name=item["name"])
        yield event("response.output_item.done", output_index=index, item=item)
    yield event("response.completed", response=final)
