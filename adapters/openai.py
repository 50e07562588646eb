"""Capture of the ``openai`` client: every chat / completions / responses call becomes a :class:`~agentlightning.Call`.

Patched with wrapt (class attributes, so every client instance, ``with_options`` copy and framework built on the
client is covered): ``chat.completions.create`` / ``parse``, ``responses.create`` / ``parse``, legacy
``completions.create``, sync and async. Streams are recorded when they are consumed (or closed / collected);
``with_raw_response`` and ``with_streaming_response`` calls are recorded once.

Outside a rollout a wrapped call costs one ContextVar lookup (and, while another rollout of the process runs, a note
of its endpoint for diagnostics). Inside one, the call path notes what the record needs and the record is built when
the rollout's calls are read (see :class:`_Pending`). A failure of capture itself is logged and the agent's call
proceeds unchanged; an error raised by the API is recorded (status 'error') and re-raised as is.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import itertools
import logging
import operator
import os
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import wrapt
from pydantic import ConfigDict, TypeAdapter, ValidationError

from agentlightning.context import DeferredCall, RolloutRecorder, _current_recorder, _current_role, rollouts_running
from agentlightning.messages import as_plain, responses_input_to_messages
from agentlightning.telemetry import emit_call_span
from agentlightning.types import Call, construct_trusted, static_defaults

logger = logging.getLogger(__name__)

# (module, class, method, api name recorded in Call.metadata["api"], is_async)
_TARGETS: tuple[tuple[str, str, str, str, bool], ...] = (
    ("openai.resources.chat.completions.completions", "Completions", "create", "chat.completions", False),
    ("openai.resources.chat.completions.completions", "Completions", "parse", "chat.completions.parse", False),
    ("openai.resources.chat.completions.completions", "AsyncCompletions", "create", "chat.completions", True),
    ("openai.resources.chat.completions.completions", "AsyncCompletions", "parse", "chat.completions.parse", True),
    ("openai.resources.responses.responses", "Responses", "create", "responses", False),
    ("openai.resources.responses.responses", "Responses", "parse", "responses.parse", False),
    ("openai.resources.responses.responses", "AsyncResponses", "create", "responses", True),
    ("openai.resources.responses.responses", "AsyncResponses", "parse", "responses.parse", True),
    ("openai.resources.completions", "Completions", "create", "completions", False),
    ("openai.resources.completions", "AsyncCompletions", "create", "completions", True),
)

# Request fields recorded as sampling parameters (everything else is input, tools or transport options).
SAMPLING_KEYS: frozenset[str] = frozenset({
    "temperature", "top_p", "max_tokens", "max_completion_tokens", "max_output_tokens", "n", "stop", "seed",
    "presence_penalty", "frequency_penalty", "logprobs", "top_logprobs", "logit_bias", "tool_choice",
    "parallel_tool_calls", "reasoning_effort", "reasoning", "response_format", "text", "best_of", "echo",
    "suffix", "user", "service_tier", "store", "truncation", "verbosity", "stream_options", "modalities",
})

# Call ids: a random prefix per process (renewed in forked children) and a counter; no syscall or random draw per
# call, and an agent seeding `random` cannot make ids repeat.
_call_id_prefix = ""
_call_numbers = itertools.count(1)


def _new_call_id_prefix() -> None:
    global _call_id_prefix
    _call_id_prefix = f"call-{os.urandom(6).hex()}-"


_new_call_id_prefix()
os.register_at_fork(after_in_child=_new_call_id_prefix)
_clock = time.time
_lock = threading.Lock()
_originals: list[tuple[type, str, Any]] = []
_active = False
# The latest patched calls made outside any rollout while one was running, as (unix time, base URL): diagnostics
# uses them to explain rollouts that captured nothing (typically a thread started without copying the context).
_stray_calls: deque[tuple[float, str | None]] = deque(maxlen=64)


# -- install / uninstall -----------------------------------------------------------------------------------------


def install() -> None:
    """Patch the openai client classes (idempotent)."""
    global _active
    with _lock:
        if _originals:
            _active = True
            return
        for module_name, class_name, method, api, is_async in _TARGETS:
            try:
                cls = getattr(importlib.import_module(module_name), class_name)
                original = cls.__dict__[method]
            except (ImportError, AttributeError, KeyError):
                logger.warning("openai capture: %s.%s.%s not found; that API is not captured",
                               module_name, class_name, method)
                continue
            wrapper = _async_wrapper(api) if is_async else _sync_wrapper(api)
            setattr(cls, method, wrapt.FunctionWrapper(original, wrapper))
            _originals.append((cls, method, original))
        _active = True


def uninstall() -> None:
    """Restore the original openai methods (idempotent)."""
    global _active
    with _lock:
        for cls, method, original in reversed(_originals):
            setattr(cls, method, original)
        _originals.clear()
        _active = False


def is_installed() -> bool:
    """Whether the openai client is patched now."""
    return _active


def _note_stray(resource: Any) -> None:
    """Remember a call made outside every rollout, if some rollout of this process is running (its diagnostics
    may need it); with none running there is nothing to explain and nothing is noted."""
    if rollouts_running():
        _stray_calls.append((time.time(), _endpoint(resource)))


def unattributed_since(start: float) -> list[tuple[float, str | None]]:
    """(time, base URL) of the recent patched calls made outside any rollout since unix time ``start``."""
    return [(when, endpoint) for when, endpoint in list(_stray_calls) if when >= start]


_endpoint_cache: dict[int, tuple[Any, str]] = {}


def _endpoint(resource: Any) -> str | None:
    """The base URL of the client behind ``resource``, without trailing slash (memoised per URL object)."""
    client = getattr(resource, "_client", None)
    if client is None:
        return None
    url = getattr(client, "_base_url", None) or client.base_url
    cached = _endpoint_cache.get(id(url))
    if cached is not None and cached[0] is url:
        return cached[1]
    if len(_endpoint_cache) > 1024:
        _endpoint_cache.clear()
    text = str(url).rstrip("/")
    _endpoint_cache[id(url)] = (url, text)
    return text


# -- the wrappers ------------------------------------------------------------------------------------------------


def _sync_wrapper(api: str) -> Callable[..., Any]:
    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        recorder = _current_recorder.get()
        if recorder is None or not _active:
            _note_stray(instance)
            return wrapped(*args, **kwargs)
        try:
            pending = _Pending(api, recorder, instance, kwargs)
        except Exception:  # noqa: BLE001 - a capture bug must not break the agent
            logger.warning(_START_FAILED, exc_info=True)
            return wrapped(*args, **kwargs)
        try:
            result = wrapped(*args, **kwargs)
        except BaseException as exc:
            pending.fail(exc)
            raise
        return pending.handle(result)

    return wrapper


def _async_wrapper(api: str) -> Callable[..., Any]:
    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        recorder = _current_recorder.get()
        if recorder is None or not _active:
            _note_stray(instance)
            return wrapped(*args, **kwargs)
        return _acall(api, recorder, wrapped, instance, args, kwargs)

    return wrapper


async def _acall(
    api: str, recorder: RolloutRecorder, wrapped: Callable[..., Any], instance: Any,
    args: tuple[Any, ...], kwargs: dict[str, Any],
) -> Any:
    try:
        pending = _Pending(api, recorder, instance, kwargs)
    except Exception:  # noqa: BLE001 - a capture bug must not break the agent
        logger.warning(_START_FAILED, exc_info=True)
        return await wrapped(*args, **kwargs)
    try:
        result = await wrapped(*args, **kwargs)
    except BaseException as exc:
        pending.fail(exc)
        raise
    return pending.handle(result)


_START_FAILED = "openai capture failed at call start; this call is not recorded"


# -- one call being recorded ---------------------------------------------------------------------------------------


class _Pending(DeferredCall):
    """One call: attached to its rollout when it starts, finished (ok or failed), then built into its record.

    The call path only notes what is needed (times, order, role, a snapshot of the request, the response's fields);
    the :class:`Call` record is built when the rollout's calls are read (see :class:`RolloutRecorder`), or at once
    when OTel tracing is on, so that the span is emitted inside the agent's current trace context.
    """

    __slots__ = ("api", "recorder", "resource", "kwargs", "start_time", "end_time", "sequence", "call_number", "role",
                 "finished", "fields", "extra", "error", "built")

    def __init__(self, api: str, recorder: RolloutRecorder, resource: Any, kwargs: dict[str, Any]) -> None:
        self.api = api
        self.recorder = recorder
        self.resource = resource
        self.start_time = _clock()
        self.role = _current_role.get()
        # The request as sent, safe to read after the call returns: shallow copies of the fields an agent may change
        # afterwards (the messages list it appends to, the dicts in it, ...). A one-shot iterable (e.g. a generator
        # of messages) is materialised in ``kwargs`` too, so that reading it here does not starve the real call.
        snapshot = kwargs.copy()
        for key, value in kwargs.items():
            if key not in _SNAPSHOT_KEYS:
                continue
            kind = type(value)
            if kind is dict:
                snapshot[key] = value.copy()
                continue
            if kind is not list and kind is not tuple:
                if value is None or isinstance(value, (str, dict)) or not hasattr(value, "__iter__"):
                    continue
                value = kwargs[key] = list(value)
            copied = []
            for item in value:
                copied.append(item.copy() if type(item) is dict else item)
            snapshot[key] = copied
        self.kwargs = snapshot
        self.finished = False
        self.fields: dict[str, Any] | None = None
        self.built: Call | None = None
        self.call_number = next(_call_numbers)  # its id (taken now, so that every build gives the same record)
        self.sequence = recorder.start_call(self)

    @property
    def endpoint(self) -> str | None:
        """The base URL of the client that made the call."""
        return _endpoint(self.resource)

    # result dispatch

    def handle(self, result: Any) -> Any:
        """Record ``result`` (or arrange to record it when a stream / raw response is consumed); return it as is."""
        try:
            kind = _RESULT_KINDS.get(type(result)) or _result_kind(type(result))
            if kind == "parsed":
                self._finish(_FIELD_READERS[self.api](result))
            elif kind == "stream":
                _observe_stream(result, self)
            elif kind == "legacy" and not getattr(result, "_stream", False):
                self.record(_FIELD_READERS[self.api](result.http_response.json()), raw=True)
            else:  # a raw response (or a raw stream): recorded when parsed
                _observe_on_parse(result, self)
        except Exception:  # noqa: BLE001
            logger.warning("openai capture failed to record a %s call; the agent continues", self.api, exc_info=True)
            self.finished = True  # with no fields: dropped when the rollout's calls are read
        return result

    def fail(self, exc: BaseException) -> None:
        """Record the call as failed by ``exc`` (the caller re-raises it)."""
        try:
            status = getattr(exc, "status_code", None)
            extra = {"error_type": type(exc).__name__, **({"http_status": status} if status else {})}
            self._finish({"output": None}, extra=extra, error=f"{type(exc).__name__}: {exc}")
        except Exception:  # noqa: BLE001
            logger.warning("openai capture failed to record a failed %s call", self.api, exc_info=True)

    def record(self, fields: dict[str, Any], *, raw: bool = False, stream: bool = False,
               error: BaseException | None = None) -> None:
        """Record a completed (or, with ``error``, interrupted) call from extracted response fields."""
        extra: dict[str, Any] = {}
        if raw:
            extra["raw_response"] = True
        if stream:
            extra["stream"] = True
        message = None
        if error is not None:
            message = f"{type(error).__name__}: {error}"
            extra["error_type"] = type(error).__name__
        self._finish(fields, extra=extra, error=message)

    def _finish(self, fields: dict[str, Any], *, extra: dict[str, Any] | None = None, error: str | None = None) -> None:
        if self.finished:
            return
        self.end_time = _clock()
        self.fields, self.extra, self.error = fields, extra, error
        self.finished = True
        if self.recorder.traced:
            # The span goes out now, under the agent's current trace context; the record is the one built for it.
            try:
                emit_call_span(self.build())
            except Exception:  # noqa: BLE001
                logger.warning("could not emit the OpenTelemetry span of a %s call", self.api, exc_info=True)

    def build(self) -> Call:
        """The :class:`Call` record of this finished call (built once)."""
        if self.built is not None:
            return self.built
        fields = self.fields
        if fields is None:
            raise RuntimeError(f"capture failed while recording this {self.api} call (see the warning logged then)")
        kwargs, recorder, api = self.kwargs, self.recorder, self.api
        sampling: dict[str, Any] = {}
        for key, value in kwargs.items():
            if key in SAMPLING_KEYS:
                if type(value) in _SCALARS:
                    sampling[key] = value
                elif _given(value):
                    sampling[key] = _jsonable(value)
        extra_body = kwargs.get("extra_body")
        if extra_body and isinstance(extra_body, dict):
            sampling.update({key: _jsonable(value) for key, value in extra_body.items()})
        metadata: dict[str, Any] = {"endpoint": _endpoint(self.resource), "api": api,
                                    "stream": bool(kwargs.get("stream")), "sampling": sampling}
        if self.extra:
            metadata.update(self.extra)
        usage = fields.get("usage")
        if usage is not None:  # its token counts (nested details left out); nothing in an agent rewrites usage
            counts = usage if type(usage) is dict else getattr(usage, "__dict__", None)
            tokens: dict[str, int] = {}
            if isinstance(counts, dict):
                for key, value in counts.items():
                    if type(value) is int:
                        tokens[key] = value
            metadata["usage"] = tokens
        response_model = fields.get("response_model")
        if response_model is not None:
            metadata["response_model"] = response_model
        choices = fields.get("choices", 1)
        if choices > 1:
            metadata["choices"] = choices
        if recorder.model_version is not None:
            metadata["model_version"] = recorder.model_version
        input_ = _dicts_as_sent(kwargs.get("messages"))[0] if api in _CHAT_APIS else _request_input(api, kwargs)
        tools, plain_tools = _dicts_as_sent(kwargs.get("tools"))
        name, response_id, role = kwargs.get("model"), fields.get("response_id"), self.role
        data = _CALL_DEFAULTS.copy()  # every field of Call, in declaration order
        data["call_id"] = _call_id_prefix + str(self.call_number)
        data["rollout_id"] = recorder.rollout_id
        data["sequence"] = self.sequence
        data["role"] = role
        data["name"] = name
        data["input"] = input_
        data["output"] = fields["output"]
        data["tools"] = tools
        data["response_id"] = response_id
        data["start_time"] = self.start_time
        data["end_time"] = self.end_time
        data["metadata"] = metadata
        if self.error is not None:
            data["status"], data["error"] = "error", self.error
        trusted = plain_tools and (name is None or type(name) is str) \
            and (response_id is None or type(response_id) is str) and (role is None or type(role) is str)
        tokens = fields.get("tokens")
        if tokens is not None:  # the backend sent token ids (vLLM)
            data["token_source"] = "response"
            try:
                tokens = _checked_token_lists(tokens)
            except ValidationError:
                trusted = False  # validated (and coerced where lax validation allows) with the whole record below
            data["prompt_token_ids"], data["completion_token_ids"], data["completion_logprobs"] = tokens
        # Values of the types Call declares need no validation; pydantic checks the rest (odd types from outside).
        record = construct_trusted(Call, data) if trusted else _validated(data)
        self.built = record
        return record


_CALL_DEFAULTS = static_defaults(Call)
# The token fields of a record (from a response's extracted "tokens", when the backend sent any).
_TOKEN_FIELDS = ("prompt_token_ids", "completion_token_ids", "completion_logprobs")
# The strict check of token lists that fail the quick one of _checked_token_lists: the TypeAdapter's pydantic-core
# validator, called directly (TypeAdapter.validate_python adds a Python layer per call).
_STRICT_TOKEN_LISTS = TypeAdapter(tuple[list[int] | None, list[int] | None, list[float] | None],
                                  config=ConfigDict(strict=True)).validator


def _checked_token_lists(tokens: tuple[Any, Any, Any]) -> tuple[Any, Any, Any]:
    """Copies of the token lists a backend sent (prompt ids, completion ids, logprobs; None where not sent), each
    checked in one pass (prompts run to thousands of ids).

    The pass is ``sum`` (in C, about half the time of pydantic-core's strict check): it raises on any item that
    is not a number, and its result is an int only when every item is an int (a float anywhere makes it a float;
    a bool, an int to Python, passes and serialises as 0 or 1).
    Lists that do not pass go to the strict pydantic check, which raises ``ValidationError`` naming the bad field.
    """
    prompt_ids, completion_ids, logprobs = tokens
    try:
        if ((prompt_ids is None or type(prompt_ids) is list and type(sum(prompt_ids)) is int)
                and (completion_ids is None or type(completion_ids) is list and type(sum(completion_ids)) is int)
                and (logprobs is None or type(logprobs) is list and type(sum(logprobs, 0.0)) is float)):
            return (None if prompt_ids is None else prompt_ids.copy(),
                    None if completion_ids is None else completion_ids.copy(),
                    None if logprobs is None else logprobs.copy())
    except TypeError:
        pass
    return _STRICT_TOKEN_LISTS.validate_python(tokens)


def _validated(data: dict[str, Any]) -> Call:
    """``Call(**data)``; token fields the backend sent malformed are left out (and named in the record's metadata)
    rather than losing the call."""
    try:
        return Call(**data)
    except ValidationError as exc:
        bad = sorted({str(error["loc"][0]) for error in exc.errors()}.intersection(_TOKEN_FIELDS))
        if not bad:
            raise
        logger.warning("openai capture: the backend sent malformed %s; the call is recorded without token ids: %s",
                       ", ".join(bad), exc)
        for key in _TOKEN_FIELDS:
            data[key] = None
        data["token_source"] = None
        data["metadata"]["invalid_token_fields"] = bad
        return Call(**data)


_CHAT_APIS = frozenset({"chat.completions", "chat.completions.parse"})


# -- request side ------------------------------------------------------------------------------------------------


_SCALARS = frozenset({str, int, float, bool})


@functools.cache
def _openai_types() -> tuple[type, ...]:
    """Stream, AsyncStream, LegacyAPIResponse, APIResponse, AsyncAPIResponse (imported once)."""
    from openai import AsyncStream, Stream
    from openai._legacy_response import LegacyAPIResponse
    from openai._response import APIResponse, AsyncAPIResponse

    return Stream, AsyncStream, LegacyAPIResponse, APIResponse, AsyncAPIResponse


_RESULT_KINDS: dict[type, str] = {}


def _result_kind(result_type: type) -> str:
    """'stream', 'legacy' (``with_raw_response``), 'raw' (an API response parsed later) or 'parsed' (per type)."""
    kind = _RESULT_KINDS.get(result_type)
    if kind is None:
        Stream, AsyncStream, LegacyAPIResponse, APIResponse, AsyncAPIResponse = _openai_types()  # noqa: N806
        if issubclass(result_type, (Stream, AsyncStream)):
            kind = "stream"
        elif issubclass(result_type, LegacyAPIResponse):
            kind = "legacy"
        elif issubclass(result_type, (APIResponse, AsyncAPIResponse)):
            kind = "raw"
        else:
            kind = "parsed"
        _RESULT_KINDS[result_type] = kind
    return kind


@functools.cache
def _sentinel_types() -> tuple[type, ...]:
    from openai import NotGiven, Omit

    return NotGiven, Omit


def _given(value: Any) -> bool:
    return value is not None and not isinstance(value, _sentinel_types())


def _jsonable(value: Any) -> Any:
    if value is None or type(value) in _SCALARS or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, type):  # e.g. response_format=SomePydanticModel for .parse()
        return value.__name__
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    plain = as_plain(value)
    return plain if plain is not value else repr(value)


def _plain_list(value: Any) -> list[Any] | None:
    """A list copied at the call's start (see :class:`_Pending`) with its non-dict items (e.g. pydantic messages)
    made plain in place; None for an absent value."""
    if type(value) is list:
        for index, item in enumerate(value):
            if type(item) is not dict:
                value[index] = _jsonable(item)
        return value
    if not _given(value):
        return None
    return [item if type(item) is dict else _jsonable(item) for item in value]


def _dicts_as_sent(value: Any) -> tuple[list[Any] | None, bool]:
    """A request list copied at the call's start (messages, tools) made plain, and whether it held only plain dicts
    (the usual case: then it is returned as is, with no conversion to do)."""
    if value is None:
        return None, True
    if type(value) is list:
        for item in value:
            if type(item) is not dict:
                return _plain_list(value), False
        return value, True
    value = _plain_list(value)
    return value, value is None


# Request fields an agent may change after the call returns (copied when the call starts).
_SNAPSHOT_KEYS = frozenset({"messages", "tools", "input", "extra_body"})


def _request_input(api: str, kwargs: dict[str, Any]) -> Any:
    """The input of a responses or legacy completions request, as chat messages or the plain prompt."""
    if api.startswith("responses"):
        return responses_input_to_messages(kwargs.get("input"), kwargs.get("instructions") or None)
    prompt = kwargs.get("prompt")
    return _jsonable(prompt) if _given(prompt) else None


# -- response side -----------------------------------------------------------------------------------------------


_EMPTY: dict[str, Any] = {}


def _view(obj: Any) -> dict[str, Any]:
    """The fields of a response object (declared and extra, e.g. vLLM's ``token_ids``) or its JSON dict.

    Reads pydantic objects through ``__dict__`` / ``__pydantic_extra__``: ``getattr`` of a missing extra field
    raises inside pydantic, which costs microseconds per lookup. Do not mutate the result.
    """
    if obj is None:
        return _EMPTY
    if type(obj) is dict:
        return obj
    fields = getattr(obj, "__dict__", None)
    if fields is None:
        return obj if isinstance(obj, dict) else _EMPTY
    extra = getattr(obj, "__pydantic_extra__", None)
    return {**fields, **extra} if extra else fields


def _get(obj: Any, name: str) -> Any:
    """One field of a response object or dict (see :func:`_view`)."""
    return _view(obj).get(name)


def _logprob_values(entries: Any) -> list[float] | None:
    """The sampled tokens' logprobs from a choice's ``logprobs.content``: parsed entries or their JSON dicts."""
    if not entries:
        return None
    # map() with a C getter: a reply has one entry per token (hundreds), so the per-entry cost is what counts.
    return list(map(_LOGPROB_KEY if type(entries[0]) is dict else _LOGPROB_ATTRIBUTE, entries))


_LOGPROB_KEY, _LOGPROB_ATTRIBUTE = operator.itemgetter("logprob"), operator.attrgetter("logprob")


def _tool_call_dict(tool_call: Any) -> dict[str, Any]:
    function = _get(tool_call, "function")
    return {
        "id": _get(tool_call, "id"),
        "type": _get(tool_call, "type") or "function",
        "function": {"name": _get(function, "name"), "arguments": _get(function, "arguments")},
    }


def _with_tokens(fields: dict[str, Any], prompt_ids: Any, completion_ids: Any, logprobs: Any) -> dict[str, Any]:
    """``fields`` plus, when the backend sent any token data, "tokens": (prompt ids, completion ids, logprobs), with
    None for what it did not send."""
    if prompt_ids is not None or completion_ids is not None or logprobs is not None:
        fields["tokens"] = (prompt_ids, completion_ids, logprobs)
    return fields


def _chat_fields(response: Any) -> dict[str, Any]:
    # Reads the response, its first choice and that choice's message directly rather than through _view: this runs
    # in every captured call, right after it, when each further function call is cold. A parsed response is a
    # pydantic object (its fields, plus extras such as vLLM's token ids); a raw one is its JSON dict.
    if type(response) is dict:
        body = extra = response
    else:
        body, extra = response.__dict__, response.__pydantic_extra__ or _EMPTY
    choices = body.get("choices") or []
    choice = choice_extra = choices[0] if choices else _EMPTY
    if type(choice) is not dict:
        choice, choice_extra = choice.__dict__, choice.__pydantic_extra__ or _EMPTY
    message = choice.get("message") or _EMPTY
    if type(message) is not dict:
        message = message.__dict__  # its declared fields are all that is read
    tool_calls = message.get("tool_calls")
    output: dict[str, Any] = {
        "content": message.get("content"),
        "tool_calls": [_tool_call_dict(tc) for tc in tool_calls] if tool_calls else [],
        "finish_reason": choice.get("finish_reason"),
    }
    if message.get("refusal"):
        output["refusal"] = message["refusal"]
    fields = {"output": output, "response_id": body.get("id"), "response_model": body.get("model"),
              "usage": body.get("usage"), "choices": len(choices)}
    logprobs = choice.get("logprobs")
    prompt_ids = extra.get("prompt_token_ids") or choice_extra.get("prompt_token_ids")
    completion_ids = choice_extra.get("token_ids")
    if logprobs is None and prompt_ids is None and completion_ids is None:
        return fields  # no token data (the usual case off vLLM)
    logprob_values = None if logprobs is None else _logprob_values(_view(logprobs).get("content"))
    return _with_tokens(fields, prompt_ids, completion_ids, logprob_values)


def _completion_fields(response: Any) -> dict[str, Any]:
    choices = _get(response, "choices") or []
    choice = choices[0] if choices else None
    logprobs = _get(_get(choice, "logprobs"), "token_logprobs")
    fields = {
        "output": {"content": _get(choice, "text"), "tool_calls": [], "finish_reason": _get(choice, "finish_reason")},
        "response_id": _get(response, "id"),
        "response_model": _get(response, "model"),
        "usage": _get(response, "usage"),
        "choices": len(choices),
    }
    return _with_tokens(fields, _get(choice, "prompt_token_ids") or _get(response, "prompt_token_ids"),
                        _get(choice, "token_ids"), list(logprobs) if logprobs else None)


def _responses_fields(response: Any) -> dict[str, Any]:
    texts: list[str] = []
    tool_calls: list[dict[str, Any]] = []
    for item in _get(response, "output") or []:
        kind = _get(item, "type")
        if kind == "message":
            for part in _get(item, "content") or []:
                if _get(part, "type") == "output_text":
                    texts.append(_get(part, "text") or "")
        elif kind == "function_call":
            tool_calls.append({"id": _get(item, "call_id"), "type": "function",
                               "function": {"name": _get(item, "name"), "arguments": _get(item, "arguments")}})
    status = _get(response, "status")
    if status == "incomplete":
        finish = _get(_get(response, "incomplete_details"), "reason") or "incomplete"
        finish = "length" if finish == "max_output_tokens" else finish
    else:
        finish = "tool_calls" if tool_calls else "stop"
    fields = {
        "output": {"content": "".join(texts) if texts else None, "tool_calls": tool_calls, "finish_reason": finish},
        "response_id": _get(response, "id"),
        "response_model": _get(response, "model"),
        "usage": _get(response, "usage"),
    }
    return _with_tokens(fields, _get(response, "prompt_token_ids"), _get(response, "output_token_ids"), None)


# The reader of each captured api's finished (non-stream) response, object or JSON dict: output, token ids, usage
# and ids.
_FIELD_READERS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "chat.completions": _chat_fields, "chat.completions.parse": _chat_fields, "responses": _responses_fields,
    "responses.parse": _responses_fields, "completions": _completion_fields,
}


# -- streams -----------------------------------------------------------------------------------------------------


class _StreamAccumulator:
    """Folds stream chunks / events into the fields of the complete response."""

    def __init__(self, api: str) -> None:
        self.api = api
        self.texts: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.response_id: str | None = None
        self.model: str | None = None
        self.usage: Any = None  # the last usage block seen (object or dict)
        self.responses_api = api.startswith("responses")
        self.prompt_ids: list[int] | None = None
        self.completion_ids: list[int] = []
        self.logprobs: list[float] = []
        self.final_response: Any = None

    def add(self, chunk: Any) -> None:
        # Runs once per chunk (a long completion streams hundreds): the delta is read in place, and logprobs only
        # when the chunk has them.
        body = _view(chunk)
        if self.responses_api:
            kind = body.get("type")
            if kind in ("response.completed", "response.incomplete", "response.failed"):
                self.final_response = body.get("response")
            elif kind == "response.output_text.delta":
                self.texts.append(body.get("delta") or "")
            return
        if self.response_id is None:
            self.response_id, self.model = body.get("id"), body.get("model")
        usage = body.get("usage")
        if usage is not None:
            self.usage = usage
        prompt_ids = body.get("prompt_token_ids")
        for choice_object in body.get("choices") or ():
            choice = _view(choice_object)  # with its extras, e.g. vLLM's token_ids
            if choice.get("index"):
                continue  # only the first choice is recorded
            prompt_ids = prompt_ids or choice.get("prompt_token_ids")
            ids = choice.get("token_ids")
            if ids is not None:
                self.completion_ids.extend(ids)
            if self.api == "completions":
                self.texts.append(choice.get("text") or "")
            else:
                delta = choice.get("delta")
                if delta is not None:
                    delta = delta if type(delta) is dict else getattr(delta, "__dict__", _EMPTY)
                    content = delta.get("content")
                    if content:
                        self.texts.append(content)
                    if delta.get("tool_calls"):
                        self._tool_call_deltas(delta["tool_calls"])
            logprobs = choice.get("logprobs")
            if logprobs is not None:
                logprobs = _view(logprobs)
                values = logprobs.get("token_logprobs") if self.api == "completions" \
                    else _logprob_values(logprobs.get("content"))
                if values:
                    self.logprobs.extend(values)
            finish_reason = choice.get("finish_reason")
            if finish_reason:
                self.finish_reason = finish_reason
        if prompt_ids is not None and self.prompt_ids is None:
            self.prompt_ids = list(prompt_ids)

    def _tool_call_deltas(self, tool_calls: Any) -> None:
        for tool_call in tool_calls:
            tc = _view(tool_call)
            slot = self.tool_calls.setdefault(
                tc.get("index") or 0, {"id": None, "type": "function", "function": {"name": None, "arguments": ""}}
            )
            slot["id"] = tc.get("id") or slot["id"]
            function = _view(tc.get("function"))
            slot["function"]["name"] = function.get("name") or slot["function"]["name"]
            slot["function"]["arguments"] += function.get("arguments") or ""

    def fields(self) -> dict[str, Any]:
        if self.final_response is not None:
            return _responses_fields(self.final_response)
        text = "".join(self.texts)
        output: dict[str, Any] = {
            "content": text if text or not self.tool_calls else None,
            "tool_calls": [self.tool_calls[i] for i in sorted(self.tool_calls)],
            "finish_reason": self.finish_reason,
        }
        fields = {"output": output, "response_id": self.response_id, "response_model": self.model, "usage": self.usage}
        return _with_tokens(fields, self.prompt_ids, self.completion_ids or None, self.logprobs or None)


class _StreamRecording:
    """Wraps the iteration over a stream: keeps its chunks, and records the call when iteration ends.

    Ends are: exhausted (complete), raised (recorded with the error), closed or collected early (GeneratorExit:
    recorded as an incomplete stream). A stream never iterated records nothing, as before any chunk arrives. The
    chunks are folded into the response's fields at the end, in one warm loop, rather than one by one in between the
    client's own work on each.
    """

    __slots__ = ("pending", "chunks")

    def __init__(self, pending: _Pending) -> None:
        self.pending = pending
        self.chunks: list[Any] = []

    def __enter__(self) -> _StreamRecording:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        error = None if exc is None or isinstance(exc, GeneratorExit) else exc
        try:
            accumulator = _StreamAccumulator(self.pending.api)
            for chunk in self.chunks:
                try:
                    accumulator.add(chunk)
                except Exception:  # noqa: BLE001
                    logger.warning("openai capture could not read a stream chunk", exc_info=True)
            self.chunks = []
            fields = accumulator.fields()
            if exc_type is not None and error is None:
                fields["output"]["finish_reason"] = fields["output"].get("finish_reason") or "incomplete_stream"
            self.pending.record(fields, stream=True, error=error)
        except Exception:  # noqa: BLE001
            logger.warning("openai capture failed to record a streamed %s call", self.pending.api, exc_info=True)


def _observe_stream(stream: Any, pending: _Pending) -> None:
    """Record ``stream`` (sync or async) when it is consumed, fails, or is closed / collected early (same object)."""
    if getattr(stream, "_agl_observed", False):
        return
    observe = _observed_async if isinstance(stream, _openai_types()[1]) else _observed_sync
    stream._iterator = observe(stream._iterator, _StreamRecording(pending))
    stream._agl_observed = True


def _observed_sync(inner: Iterator[Any], recording: _StreamRecording) -> Iterator[Any]:
    with recording:
        keep = recording.chunks.append
        for chunk in inner:
            keep(chunk)
            yield chunk


async def _observed_async(inner: AsyncIterator[Any], recording: _StreamRecording) -> AsyncIterator[Any]:
    with recording:
        keep = recording.chunks.append
        async for chunk in inner:
            keep(chunk)
            yield chunk


def _observe_on_parse(raw: Any, pending: _Pending) -> None:
    """For raw responses whose body is read later: record when ``raw.parse()`` is called (once)."""
    streams = _openai_types()[:2]
    original = raw.parse

    def observe(parsed: Any) -> Any:
        try:
            if isinstance(parsed, streams):
                _observe_stream(parsed, pending)
            else:
                pending.record(_FIELD_READERS[pending.api](parsed), raw=True)
        except Exception:  # noqa: BLE001
            logger.warning("openai capture failed to record a raw %s response", pending.api, exc_info=True)
        return parsed

    if inspect.iscoroutinefunction(original):

        @functools.wraps(original)
        async def aparse(*args: Any, **kwargs: Any) -> Any:
            return observe(await original(*args, **kwargs))

        raw.parse = aparse
    else:

        @functools.wraps(original)
        def parse(*args: Any, **kwargs: Any) -> Any:
            return observe(original(*args, **kwargs))

        raw.parse = parse
