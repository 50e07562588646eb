"""Capture overhead per openai call, against the unpatched client in the same run (no network).

The client talks to an in-process ``httpx2.MockTransport`` (the transport layer the openai client uses) that returns
a canned chat completion, so the measured time is the client's own work plus capture. Modes, alternating sample by
sample so that machine load hits them alike:

- ``unpatched``: the original method, bound per call as an unpatched client's is (the baseline);
- ``unpatched again``: the same once more, an A/A control: its difference from the baseline is the noise floor;
- ``patched, no rollout``: adapter installed, call made outside any rollout (the one-ContextVar fast path);
- ``captured``: one call inside a fresh rollout, timed until the rollout's calls are read (the ``Call`` record, with
  messages, output, usage and sampling params, is built when the call ends);
- ``captured + token ids``: the same with vLLM-style ``prompt_token_ids`` / ``token_ids`` / logprobs in the response;
- ``stream unpatched`` / ``stream captured``: a 12-chunk streamed reply;
- ``rollout of 6``: six calls, then (captured) the rollout's records read, as at a rollout's end;
- ``rollout of 6 + token ids``: the same with vLLM-style token ids (a training rollout served by vLLM);
- ``agent turn``: a rollout's only call with a realistic payload: six messages (system prompt, tool call and result,
  ~2 KB), three tools offered, and a 150-token reply with vLLM token ids (a 1,500-token prompt) and logprobs.

Run: ``python -m pytest -q -s tests/benchmarks/bench_capture.py`` (or ``python tests/benchmarks/bench_capture.py``).
Guard: the capture work under 5% of the call's own time (30 microseconds was the target before the redesign). On a
shared, loaded machine the end-to-end difference of two medians is noisy at the microsecond scale, so the benchmark
also times the capture work alone (the same code the wrapper runs, on a real parsed response) and prints a CPU
reference figure.
"""

from __future__ import annotations

import json
import random
import statistics
import time
import timeit
from collections.abc import Callable
from typing import Any

import httpx2
import openai
from agentlightning.adapters import _stainless
from agentlightning.adapters import openai as adapter

from agentlightning.capture._context import RolloutRecorder, recording

MESSAGES = [{"role": "system", "content": "You are a SQL expert."}, {"role": "user", "content": "How many users?"}]
CONTENT = "SELECT count(*) FROM users;"
ROLLOUT_CALLS = 6


def _completion(token_ids: bool) -> bytes:
    choice: dict = {
        "index": 0,
        "finish_reason": "stop",
        "logprobs": None,
        "message": {"role": "assistant", "content": CONTENT, "refusal": None},
    }
    body: dict = {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1,
        "model": "bench-model",
        "choices": [choice],
        "usage": {"prompt_tokens": 40, "completion_tokens": 9, "total_tokens": 49},
    }
    if token_ids:
        choice["token_ids"] = list(range(100, 109))
        choice["logprobs"] = {"content": [{"token": "t", "logprob": -0.1, "bytes": [116], "top_logprobs": []}] * 9}
        body["prompt_token_ids"] = list(range(1, 41))
    return json.dumps(body).encode()


SYSTEM_PROMPT = "You are a careful data analyst. Answer with one SQLite query. Schema: " + ", ".join(
    f"table_{i}(id INTEGER PRIMARY KEY, name TEXT, created_at TEXT, amount REAL, owner_id INTEGER)" for i in range(8)
)
TURN_MESSAGES = [
    {"role": "system", "content": SYSTEM_PROMPT},
    {"role": "user", "content": "Which owners spent more than 1000 in total last month, largest first?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {
                    "name": "run_sql",
                    "arguments": json.dumps({"query": "SELECT owner_id, sum(amount) FROM table_1 GROUP BY 1"}),
                },
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": json.dumps([[i, 1000.5 + i] for i in range(40)])},
    {"role": "assistant", "content": "These are the totals over all time; 23 owners are above 1000."},
    {"role": "user", "content": "Now restrict it to last month and order by the total."},
]
TURN_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name.replace('_', ' ')} against the analytics database",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
        },
    }
    for name in ("run_sql", "describe_table", "sample_rows")
]


def _turn_completion() -> bytes:
    """A 150-token reply with vLLM-style token ids (1,500-token prompt) and logprobs."""
    content = "SELECT owner_id, sum(amount) AS total FROM table_1 WHERE created_at >= date('now', '-1 month') " * 6
    entry = {"token": "tok", "logprob": -0.25, "bytes": [116, 111, 107], "top_logprobs": []}
    choice = {
        "index": 0,
        "finish_reason": "stop",
        "logprobs": {"content": [entry] * 150},
        "token_ids": list(range(150)),
        "message": {"role": "assistant", "content": content, "refusal": None},
    }
    return json.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 1,
            "model": "bench-model",
            "choices": [choice],
            "prompt_token_ids": list(range(1500)),
            "usage": {"prompt_tokens": 1500, "completion_tokens": 150, "total_tokens": 1650},
        }
    ).encode()


def _stream_body() -> bytes:
    events = []
    for index, piece in enumerate([CONTENT[i : i + 3] for i in range(0, 36, 3)]):
        delta = {"role": "assistant", "content": piece} if index == 0 else {"content": piece}
        events.append(
            {
                "id": "chatcmpl-bench",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": "bench",
                "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
            }
        )
    events.append(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "bench",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        }
    )
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def _client(body: bytes, content_type: str = "application/json") -> openai.OpenAI:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, content=body, headers={"content-type": content_type})

    return openai.OpenAI(
        base_url="http://bench.local/v1",
        api_key="x",
        max_retries=0,
        http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
    )


BASELINES = {
    "unpatched again": "unpatched",
    "patched, no rollout": "unpatched",
    "captured": "unpatched",
    "captured + token ids": "unpatched + token ids",
    "stream captured": "stream unpatched",
    f"rollout of {ROLLOUT_CALLS}, captured": f"rollout of {ROLLOUT_CALLS}, unpatched",
    f"rollout of {ROLLOUT_CALLS} + token ids, captured": f"rollout of {ROLLOUT_CALLS} + token ids, unpatched",
    "agent turn, captured": "agent turn, unpatched",
}


def _sample(call: Callable[[], object]) -> float:
    """CPU seconds of this thread spent in ``call()`` (time spent descheduled on a busy machine is excluded)."""
    started = time.thread_time()
    call()
    return time.thread_time() - started


def _captured(call: Callable[[], object], calls: int = 1) -> Callable[[], float]:
    """A sample of ``calls`` calls inside a fresh rollout, timed up to their records being read (as at its end)."""

    def sample() -> float:
        recorder = RolloutRecorder("ro-bench")
        with recording(recorder):
            started = time.thread_time()
            for _ in range(calls):
                call()
            built = recorder.calls
            elapsed = time.thread_time() - started
        assert len(built) == calls, f"{len(built)} of {calls} calls recorded"
        return elapsed

    return sample


def _plain(call: Callable[[], object], calls: int = 1) -> Callable[[], float]:
    def sample() -> float:
        started = time.thread_time()
        for _ in range(calls):
            call()
        return time.thread_time() - started

    return sample


def measure(n: int = 1500) -> dict[str, float]:
    """Median seconds per call of each mode, records built included.

    Modes alternate in a shuffled order each cycle (the unpatched twin calls the original method under the
    wrapper), so a burst of machine load hits all of them alike; each sample is the thread's CPU time, and medians
    ignore the bursts themselves. Rollout modes make ``ROLLOUT_CALLS`` calls per sample (reported per call).
    """
    from openai.resources.chat.completions.completions import Completions

    adapter.install()
    original_create = Completions.__dict__["create"].__wrapped__
    plain, with_ids, streaming = (
        _client(_completion(False)),
        _client(_completion(True)),
        _client(_stream_body(), "text/event-stream"),
    )
    kwargs = {"model": "bench-model", "messages": MESSAGES, "temperature": 0.7, "max_tokens": 128}
    turn = _client(_turn_completion())
    turn_kwargs = {
        "model": "bench-model",
        "messages": TURN_MESSAGES,
        "tools": TURN_TOOLS,
        "temperature": 0.7,
        "max_tokens": 512,
        "logprobs": True,
    }

    def patched(client: openai.OpenAI) -> Callable[[], object]:
        return lambda: client.chat.completions.create(**kwargs)

    def unpatched(client: openai.OpenAI) -> Callable[[], object]:
        # Bound per call, as ``client.chat.completions.create`` is when nothing is patched.
        return lambda: original_create.__get__(client.chat.completions)(**kwargs)

    modes: dict[str, Callable[[], float]] = {
        "unpatched": _plain(unpatched(plain)),
        "unpatched again": _plain(unpatched(plain)),
        "patched, no rollout": _plain(patched(plain)),
        "captured": _captured(patched(plain)),
        "unpatched + token ids": _plain(unpatched(with_ids)),
        "captured + token ids": _captured(patched(with_ids)),
        "stream unpatched": _plain(
            lambda: list(original_create.__get__(streaming.chat.completions)(stream=True, **kwargs))
        ),
        "stream captured": _captured(lambda: list(streaming.chat.completions.create(stream=True, **kwargs))),
        f"rollout of {ROLLOUT_CALLS}, unpatched": _plain(unpatched(plain), ROLLOUT_CALLS),
        f"rollout of {ROLLOUT_CALLS}, captured": _captured(patched(plain), ROLLOUT_CALLS),
        f"rollout of {ROLLOUT_CALLS} + token ids, unpatched": _plain(unpatched(with_ids), ROLLOUT_CALLS),
        f"rollout of {ROLLOUT_CALLS} + token ids, captured": _captured(patched(with_ids), ROLLOUT_CALLS),
        "agent turn, unpatched": _plain(lambda: original_create.__get__(turn.chat.completions)(**turn_kwargs)),
        "agent turn, captured": _captured(lambda: turn.chat.completions.create(**turn_kwargs)),
    }
    samples: dict[str, list[float]] = {name: [] for name in modes}
    order = list(modes)
    shuffler = random.Random(0)
    for index in range(n + 50):
        shuffler.shuffle(order)  # no mode always runs first (or right after another)
        for name in order:
            elapsed = modes[name]()
            if index >= 50:  # warm-up
                samples[name].append(elapsed / (ROLLOUT_CALLS if name.startswith("rollout") else 1))
    medians = {name: statistics.median(values) for name, values in samples.items()}
    for name, base in BASELINES.items():
        if name in samples:  # paired: differences within the same cycle cancel slow drifts of machine load
            medians[f"{name} (paired)"] = statistics.median(
                a - b for a, b in zip(samples[name], samples[base], strict=True)
            )
    return medians


def _per_call(step: Callable[[], object], n: int) -> float:
    """Thread CPU seconds per ``step()``: the best of five blocks of ``n // 5`` steps."""
    timings = []
    for _ in range(5):
        started = time.thread_time()
        for _ in range(n // 5):
            step()
        timings.append((time.thread_time() - started) / (n // 5))
    return min(timings)


def capture_work(n: int = 5000) -> dict[str, float]:
    """Seconds of capture work alone per call (start, response read and record build on a real parsed response)."""
    kwargs = {"model": "bench-model", "messages": MESSAGES, "temperature": 0.7, "max_tokens": 128}
    result = {}
    for label, body in (("capture work", _completion(False)), ("capture work + token ids", _completion(True))):
        client = _client(body)
        response = client.chat.completions.with_raw_response.create(**kwargs).parse()
        resource = client.chat.completions

        def call(resource: Any = resource, response: Any = response) -> object:
            recorder = RolloutRecorder("ro-bench")
            _stainless.ClientCall(openai, "chat.completions", recorder, resource, dict(kwargs)).handle(response)
            return recorder.calls

        result[label] = _per_call(call, n)
    client = _client(_stream_body(), "text/event-stream")
    chunks = list(client.chat.completions.with_raw_response.create(stream=True, **kwargs).parse())
    resource = client.chat.completions

    def stream() -> object:
        recorder = RolloutRecorder("ro-bench")
        call = _stainless.ClientCall(openai, "chat.completions", recorder, resource, {**kwargs, "stream": True})
        list(_stainless.observed(iter(chunks), call))
        return recorder.calls

    result["capture work, stream"] = _per_call(stream, n)
    return result


def cpu_reference() -> float:
    """Microseconds for ``sum(range(100))``: about 0.6 on an idle modern core; higher means a loaded machine."""
    return min(timeit.repeat("sum(range(100))", number=20000, repeat=5)) / 20000 * 1e6


def report(results: dict[str, float], work: dict[str, float]) -> dict[str, tuple[float, float]]:
    """Print and return (microseconds added, % of the call's own time) per mode against its baseline."""
    baselines = {
        **BASELINES,
        "capture work": "unpatched",
        "capture work + token ids": "unpatched + token ids",
        "capture work, stream": "stream unpatched",
    }
    print(f"\n{'mode (median CPU time per call)':<36}{'us/call':>10}{'added us':>10}{'added %':>9}")
    overhead: dict[str, tuple[float, float]] = {}
    for name, seconds in {**results, **work}.items():
        if name.endswith(" (paired)"):
            continue
        if name in work:
            line = f"{name:<36}{'':>10}{seconds * 1e6:>10.1f}"
            overhead[name] = (seconds * 1e6, 100 * seconds / results[baselines[name]])
            line += f"{overhead[name][1]:>8.2f}%"
        else:
            line = f"{name:<36}{seconds * 1e6:>10.1f}"
            if name in baselines:
                base = results[baselines[name]]
                overhead[name] = ((seconds - base) * 1e6, 100 * (seconds - base) / base)
                line += f"{overhead[name][0]:>10.1f}{overhead[name][1]:>8.2f}%"
                paired = results[f"{name} (paired)"]
                overhead[f"{name} (paired)"] = (paired * 1e6, 100 * paired / base)
                line += f"   paired: {paired * 1e6:+.1f} us ({100 * paired / base:+.2f}%)"
        print(line)
    return overhead


def test_capture_overhead() -> None:
    reference = cpu_reference()
    overhead = report(measure(), capture_work())
    added, percent = overhead["captured (paired)"]
    in_rollout, in_rollout_percent = overhead[f"rollout of {ROLLOUT_CALLS}, captured (paired)"]
    with_ids, with_ids_percent = overhead[f"rollout of {ROLLOUT_CALLS} + token ids, captured (paired)"]
    work, work_percent = overhead["capture work"]
    turn, turn_percent = overhead["agent turn, captured (paired)"]
    print(f"cpu reference: sum(range(100)) = {reference:.2f} us (about 0.6 on an idle core)")
    print(
        f"capture adds {in_rollout:.1f} us per call in a rollout of {ROLLOUT_CALLS} end to end, records built "
        f"(median paired difference, {in_rollout_percent:.2f}% of the unpatched call), {with_ids:.1f} us with "
        f"token ids ({with_ids_percent:.2f}%), {added:.1f} us to a rollout's only call ({percent:.2f}%); the "
        f"capture work itself is {work:.1f} us ({work_percent:.2f}%); a realistic agent turn with vLLM token ids "
        f"{turn:.1f} us ({turn_percent:.2f}%); guard: capture work < 5% of the call"
    )
    # The redesign (one wire-format module, pydantic's public API, no per-call caches) traded the earlier 30 us
    # target for clarity; its guard is the share of the call.
    assert work_percent < 5, f"capture work is {work_percent:.2f}% of a call (guard < 5%)"


if __name__ == "__main__":
    test_capture_overhead()
