"""Payloads to send: chat / completion / Responses / Anthropic Messages bodies and their stream chunks and events, with
vLLM-style token ids; built from a :class:`Reply` by the mock server and the Hugging Face backend."""

from __future__ import annotations

import functools
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Choice:
    """One generated answer, to send: text, tool calls, finish reason, completion token ids and their logprobs."""

    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # [{"id", "type", "function": {name, arguments}}]
    finish_reason: str = "stop"
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[str, Any]] | None = None  # one entry per token id (see token_logprobs); None: not asked
    # How a stream splits ``content``: (text, number of token ids it carries); the ids left go on the last chunk.
    pieces: list[tuple[str, int]] | None = None
    reasoning: str | None = None  # the reasoning text, sent as vLLM's reasoning parsers send it (``reasoning``)


@dataclass
class Reply:
    """A model's answer to one request, for the payload functions below."""

    model: str
    choices: list[Choice]
    prompt_token_ids: list[int]
    token_ids: bool = True  # send vLLM-style token ids (``prompt_token_ids``, ``choices[i].token_ids``)
    extra: dict[str, Any] = field(default_factory=dict)  # more top-level fields, e.g. ``model_version``
    response_id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))

    def usage(self) -> dict[str, int]:
        """Chat / completions ``usage``."""
        prompt, completion = len(self.prompt_token_ids), sum(len(choice.token_ids) for choice in self.choices)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def envelope(self, kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        """The fields every chat / completions body and chunk shares."""
        prefix = "chatcmpl-" if kind.startswith("chat") else "cmpl-"
        return {
            "id": prefix + self.response_id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **self.extra,
        }


def token_logprobs(tokens: Sequence[str], logprobs: Sequence[float], top: int = 0) -> list[dict[str, Any]]:
    """Chat ``logprobs.content`` entries for sampled ``tokens`` (the sampled one as its only alternative if
    ``top``)."""
    entries = []
    for token, logprob in zip(tokens, logprobs, strict=True):
        entry = {"token": token, "logprob": logprob, "bytes": list(token.encode())}
        entries.append({**entry, "top_logprobs": [entry] if top else []})
    return entries


def text_pieces(text: str) -> list[str]:
    """``text`` split into stream deltas: a word with its leading whitespace each."""
    return re.findall(r"\s*\S+|\s+", text)


def _completion_logprobs(entries: list[dict[str, Any]] | None, offset: int = 0) -> dict[str, Any] | None:
    if entries is None:
        return None
    tokens, offsets = [entry["token"] for entry in entries], []
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": [entry["logprob"] for entry in entries],
        "top_logprobs": [{entry["token"]: entry["logprob"]} for entry in entries],
        "text_offset": offsets,
    }


def chat_completion(reply: Reply) -> dict[str, Any]:
    """A ``chat.completion`` body."""
    choices = []
    for index, choice in enumerate(reply.choices):
        message: dict[str, Any] = {"role": "assistant", "content": choice.content, "refusal": None}
        if choice.reasoning:
            message["reasoning"] = choice.reasoning
        if choice.tool_calls:
            message["tool_calls"] = choice.tool_calls
        logprobs = None if choice.logprobs is None else {"content": choice.logprobs, "refusal": None}
        item = {"index": index, "message": message, "finish_reason": choice.finish_reason, "logprobs": logprobs}
        choices.append({**item, "token_ids": choice.token_ids} if reply.token_ids else item)
    body = {**reply.envelope("chat.completion", choices), "usage": reply.usage()}
    return {**body, "prompt_token_ids": reply.prompt_token_ids} if reply.token_ids else body


def _spans(choice: Choice, default: list[tuple[str, int]]) -> Iterator[tuple[str, slice]]:
    """The stream pieces of ``choice`` with the slice of its token ids each carries (the rest: '' at the end)."""
    start = 0
    for text, count in choice.pieces if choice.pieces is not None else default:
        yield text, slice(start, start + count)
        start += count
    yield "", slice(start, None)


def chat_chunks(reply: Reply, include_usage: bool = False) -> Iterator[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of a streamed reply (token ids on the chunks, as vLLM sends them)."""
    for index, choice in enumerate(reply.choices):
        chunk = functools.partial(_chat_chunk, reply, index, choice)
        first = chunk({"role": "assistant", "content": ""})
        yield {**first, "prompt_token_ids": reply.prompt_token_ids} if reply.token_ids and not index else first
        *pieces, (_, rest) = _spans(choice, [(choice.content or "", len(choice.token_ids))])
        if choice.reasoning:
            yield chunk({"reasoning": choice.reasoning})
        for text, ids in pieces:
            yield chunk({"content": text}, ids)
        for position, tool_call in enumerate(choice.tool_calls):
            function = tool_call["function"]
            yield chunk(
                {
                    "tool_calls": [
                        {
                            "index": position,
                            "id": tool_call["id"],
                            "type": "function",
                            "function": {"name": function["name"], "arguments": ""},
                        }
                    ]
                }
            )
            yield chunk({"tool_calls": [{"index": position, "function": {"arguments": function["arguments"]}}]})
        yield chunk({}, rest, finish=choice.finish_reason)
    if include_usage:
        yield {**reply.envelope("chat.completion.chunk", []), "usage": reply.usage()}


def _chat_chunk(
    reply: Reply,
    index: int,
    choice: Choice,
    delta: dict[str, Any],
    ids: slice = slice(0, 0),
    finish: str | None = None,
) -> dict[str, Any]:
    """One ``chat.completion.chunk`` of choice ``index``: ``delta`` with the logprobs and token ids of ``ids``."""
    entries = choice.logprobs
    logprobs = None if entries is None else {"content": entries[ids], "refusal": None}
    item = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
    if reply.token_ids:
        item["token_ids"] = choice.token_ids[ids]
    return reply.envelope("chat.completion.chunk", [item])


def completion(reply: Reply) -> dict[str, Any]:
    """A legacy ``text_completion`` body (``prompt_token_ids`` on the choice, as vLLM, and on top)."""
    choices = []
    for index, choice in enumerate(reply.choices):
        item = {
            "index": index,
            "text": choice.content or "",
            "finish_reason": choice.finish_reason,
            "logprobs": _completion_logprobs(choice.logprobs),
        }
        if reply.token_ids:
            item.update(token_ids=choice.token_ids, prompt_token_ids=reply.prompt_token_ids)
        choices.append(item)
    body = {**reply.envelope("text_completion", choices), "usage": reply.usage()}
    return {**body, "prompt_token_ids": reply.prompt_token_ids} if reply.token_ids else body


def completion_chunks(reply: Reply) -> Iterator[dict[str, Any]]:
    """The chunks of a streamed legacy completion (first choice)."""
    choice = reply.choices[0]
    offset = 0
    for position, (text, ids) in enumerate(_spans(choice, [(choice.content or "", len(choice.token_ids))])):
        logprobs = None if choice.logprobs is None else choice.logprobs[ids]
        item = {
            "index": 0,
            "text": text,
            "finish_reason": None if text else choice.finish_reason,
            "logprobs": _completion_logprobs(logprobs, offset),
        }
        body = reply.envelope("text_completion", [item])
        if reply.token_ids:
            item["token_ids"] = choice.token_ids[ids]
            if position == 0:
                item["prompt_token_ids"] = body["prompt_token_ids"] = reply.prompt_token_ids
        offset += len(text)
        yield body


def response_object(reply: Reply) -> dict[str, Any]:
    """A Responses API ``response`` (first choice; with ``prompt_token_ids`` / ``output_token_ids`` as vLLM)."""
    choice = reply.choices[0]
    output: list[dict[str, Any]] = []
    if choice.content is not None:
        output.append(
            {
                "type": "message",
                "id": f"msg_{uuid.uuid4().hex[:24]}",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": choice.content, "annotations": []}],
            }
        )
    for tool_call in choice.tool_calls:
        output.append(
            {
                "type": "function_call",
                "id": f"fc_{uuid.uuid4().hex[:24]}",
                "call_id": tool_call["id"],
                "name": tool_call["function"]["name"],
                "arguments": tool_call["function"]["arguments"],
                "status": "completed",
            }
        )
    usage = reply.usage()
    body: dict[str, Any] = {
        "id": f"resp_{reply.response_id}",
        "object": "response",
        "created_at": reply.created,
        "model": reply.model,
        "status": "completed",
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            "output_tokens": usage["completion_tokens"],
            "total_tokens": usage["total_tokens"],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }
    if reply.token_ids:
        body.update(prompt_token_ids=reply.prompt_token_ids, output_token_ids=choice.token_ids)
    return body


def response_events(reply: Reply) -> Iterator[dict[str, Any]]:
    """The events of a streamed Responses API reply."""
    return response_stream(response_object(reply))


def response_stream(final: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The events streaming the Responses API ``response`` ``final`` (its message text a word a delta, each
    function call's arguments in one delta), ending with ``response.completed`` (``response.incomplete`` for an
    incomplete one)."""
    pending = {**final, "status": "in_progress", "output": [], "usage": None}
    pending.pop("output_token_ids", None)
    events: list[tuple[str, dict[str, Any]]] = [
        ("response.created", {"response": pending}),
        ("response.in_progress", {"response": pending}),
    ]
    for index, item in enumerate(final["output"]):
        where = {"output_index": index, "item_id": item["id"]}
        if item["type"] == "message":
            part, text = item["content"][0], item["content"][0]["text"]
            events.append(
                (
                    "response.output_item.added",
                    {"output_index": index, "item": {**item, "status": "in_progress", "content": []}},
                )
            )
            events.append(("response.content_part.added", {**where, "content_index": 0, "part": {**part, "text": ""}}))
            events.extend(
                ("response.output_text.delta", {**where, "content_index": 0, "delta": piece, "logprobs": []})
                for piece in text_pieces(text)
            )
            events.append(("response.output_text.done", {**where, "content_index": 0, "text": text, "logprobs": []}))
            events.append(("response.content_part.done", {**where, "content_index": 0, "part": part}))
        else:
            events.append(
                (
                    "response.output_item.added",
                    {"output_index": index, "item": {**item, "status": "in_progress", "arguments": ""}},
                )
            )
            events.append(("response.function_call_arguments.delta", {**where, "delta": item["arguments"]}))
            events.append(
                (
                    "response.function_call_arguments.done",
                    {**where, "arguments": item["arguments"], "name": item["name"]},
                )
            )
        events.append(("response.output_item.done", {"output_index": index, "item": item}))
    events.append(
        ("response.incomplete" if final["status"] == "incomplete" else "response.completed", {"response": final})
    )
    for sequence, (kind, fields) in enumerate(events):
        yield {"type": kind, "sequence_number": sequence, **fields}


# Chat finish reasons as Anthropic stop reasons.
_STOP_REASONS = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}


def message_object(reply: Reply) -> dict[str, Any]:
    """An Anthropic Messages API ``message`` (first choice). The API has no field for token ids or logprobs: with
    ``token_ids``, they go at the top level as ``prompt_token_ids`` and ``token_ids`` (no logprobs)."""
    choice = reply.choices[0]
    content: list[dict[str, Any]] = [{"type": "text", "text": choice.content}] if choice.content else []
    content += [
        {
            "type": "tool_use",
            "id": call["id"],
            "name": call["function"]["name"],
            "input": json.loads(call["function"]["arguments"] or "{}"),
        }
        for call in choice.tool_calls
    ]
    usage = reply.usage()
    body: dict[str, Any] = {
        "id": f"msg_{reply.response_id}",
        "type": "message",
        "role": "assistant",
        "model": reply.model,
        "content": content,
        "stop_reason": _STOP_REASONS.get(choice.finish_reason, choice.finish_reason),
        "stop_sequence": None,
        "usage": {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"]},
    }
    if reply.token_ids:
        body.update(prompt_token_ids=reply.prompt_token_ids, token_ids=choice.token_ids)
    return body


def message_events(reply: Reply) -> Iterator[dict[str, Any]]:
    """The events of a streamed Anthropic message; with ``token_ids``, the prompt's ids on ``message_start``, the
    completion's on each text delta and the rest on ``message_delta``."""
    final, choice = message_object(reply), reply.choices[0]
    start = {**final, "content": [], "stop_reason": None, "usage": {**final["usage"], "output_tokens": 0}}
    start.pop("token_ids", None)
    yield {"type": "message_start", "message": start}
    *pieces, (_, rest) = _spans(choice, [(choice.content or "", len(choice.token_ids))])
    if not choice.content:
        pieces, rest = [], slice(0, None)
    for index, block in enumerate(final["content"]):
        if block["type"] == "text":
            yield {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}
            for text, ids in pieces:
                delta = {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}}
                yield {**delta, "token_ids": choice.token_ids[ids]} if reply.token_ids else delta
        else:
            yield {"type": "content_block_start", "index": index, "content_block": {**block, "input": {}}}
            yield {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"])},
            }
        yield {"type": "content_block_stop", "index": index}
    end = {
        "type": "message_delta",
        "delta": {"stop_reason": final["stop_reason"], "stop_sequence": None},
        "usage": {"output_tokens": final["usage"]["output_tokens"]},
    }
    yield {**end, "token_ids": choice.token_ids[rest]} if reply.token_ids else end
    yield {"type": "message_stop"}


async def sse(events: Iterable[dict[str, Any]], *, done: bool = True, named: bool = False) -> AsyncIterator[bytes]:
    """``events`` as the body of a server-sent event stream (for Starlette's ``StreamingResponse``): ``data: <json>``
    each (after ``event: <type>`` when ``named``), then ``data: [DONE]`` when ``done`` (chat and completions streams
    end so; Responses streams do not)."""
    for event in events:
        yield sse_event(event, named)
    if done:
        yield b"data: [DONE]\n\n"


def sse_event(event: dict[str, Any], named: bool = False) -> bytes:
    """One server-sent event: ``data: <json>``, after ``event: <type>`` when ``named``."""
    return (f"event: {event['type']}\n" if named else "").encode() + f"data: {json.dumps(event)}\n\n".encode()
