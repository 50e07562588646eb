"""Real command-line coding agents, as shipped on npm and PyPI (`make cli-agents`), as ``agl.CommandAgent`` rollouts
in client worker processes through the server's per-rollout proxy in front of ``MockLLMServer``: Claude Code
(``claude -p``, Anthropic Messages, streamed), Codex (``codex exec``, the Responses API, streamed) and mini-swe-agent
(``mini``, chat completions through LiteLLM).

The scripted model runs a shell command that writes the answer to answer.txt, a second that reads it back, then says it
is done (mini-swe-agent: submits, with the command its prompt names): every request is one recorded call with token ids,
the tool calls and their results are in the calls, the reward comes from the working directory. A model that never
answers leaves the agent hanging until its timeout kills the whole process group. The agents' HTTP(S) proxy variables
point at a sink that refuses (403) and records any connection, so an agent that tries to reach anything but the
rollout's proxy fails the test instead of hanging.

Skipped when the agents are not installed, unless AGL_REQUIRE_CLI_AGENTS=1 (CI) makes that a failure.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import command_agents
import pytest

import agentlightning as agl
from agentlightning._uvicorn import BackgroundServer
from agentlightning.client import start_workers
from agentlightning.server import LightningServer, Settings
from agentlightning.testing import MockLLMServer, MockReply, MockRequest, MockToolCall

REQUIRED = os.environ.get("AGL_REQUIRE_CLI_AGENTS") == "1"
# What each agent calls its shell tool, and how its arguments are spelled.
SHELL_TOOLS = {"Bash": "command", "exec_command": "cmd", "bash": "command"}
# Where each agent is installed.
EXECUTABLES = {
    "claude": command_agents.CLI_AGENTS / "claude",
    "codex": command_agents.CLI_AGENTS / "codex",
    "mini": command_agents.MINI_SWE_AGENT,
}
# mini-swe-agent ends its loop on a command whose output starts with this line (its mini.yaml tells the model so).
MINI_SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
TASKS = [
    {"prompt": "Write 1234 to answer.txt, then check it.", "expect": "1234"},
    {"prompt": "Write 4321 to answer.txt, then check it.", "expect": "4322"},  # the file will not hold it: reward 0
]


@pytest.fixture(params=sorted(EXECUTABLES))
def cli(request: pytest.FixtureRequest) -> str:
    if not EXECUTABLES[request.param].exists():
        _missing(request.param)
    return str(request.param)


def _missing(name: str) -> None:
    message = f"{EXECUTABLES[name]} is not installed (make cli-agents)"
    if REQUIRED:
        pytest.fail(f"AGL_REQUIRE_CLI_AGENTS=1 but {message}")
    pytest.skip(message)


class Sink:
    """An HTTP proxy that forwards nothing: every request (``CONNECT host:443`` or an absolute URL) is recorded and
    refused with 403 at once."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        target = scope.get("raw_path", b"").decode() or scope["path"]
        self.seen.append(f"{scope['method']} {target} (host {dict(scope['headers']).get(b'host', b'').decode()})")
        await send({"type": "http.response.start", "status": 403, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"agentlightning tests: no network beyond the proxy\n"})


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Sink]:
    """A fresh home (no login, no earlier session) and every proxy variable pointed at the sink, inherited by the
    worker processes and so by the agents; loopback (the rollout's proxy) is reached directly."""
    sink = Sink()
    server = BackgroundServer(sink, name="network sink").start()
    # Not under /tmp: where a system bubblewrap is installed, Codex's workspace-write sandbox runs its helper through
    # an alias in CODEX_HOME, which it refuses to create under the temporary directory (its shell tool then fails).
    home = Path(tempfile.mkdtemp(prefix="agl-cli-home-", dir="/var/tmp"))
    (home / ".codex").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("CODEX_HOME", str(home / ".codex"))
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy", "all_proxy"):
        monkeypatch.setenv(name, server.url)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    try:
        yield sink
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)


def coding_model(request: MockRequest) -> MockReply:
    """The scripted model (tools as chat functions, what the proxy sends for Messages, or Responses functions): with
    no tool result yet, write the number the prompt names to answer.txt with the agent's
    shell tool; with one, read the file back; with two, finish."""
    tools = {tool.get("name") or (tool.get("function") or {}).get("name") for tool in request.tools or []}
    shell = next((name for name in SHELL_TOOLS if name in tools), None)
    if shell is None:
        return MockReply(status=400, error_message=f"no shell tool among {sorted(map(str, tools))}")
    results = [message for message in request.messages if message.get("role") == "tool"]
    if len(results) >= 2 and shell == "bash":  # mini-swe-agent answers only with tool calls
        submit = MockToolCall(name=shell, arguments={"command": MINI_SUBMIT})
        return MockReply(content="Done: the answer is in answer.txt.", tool_calls=[submit])
    if len(results) >= 2:
        return MockReply(content="Done: the answer is in answer.txt.")
    if results:
        command = "cat answer.txt"
    else:
        number = re.search(r"Write (\d+) to answer\.txt", json.dumps(request.messages))
        command = f"echo {number[1] if number else 0} > answer.txt"
    arguments = {SHELL_TOOLS[shell]: command}
    if shell == "Bash":
        arguments["description"] = "Run a shell command"
    return MockReply(tool_calls=[MockToolCall(name=shell, arguments=arguments)])


def _serve(
    agent: agl.CommandAgent, tmp_path: Path, mock: MockLLMServer, tasks: list[dict], chat_only: bool = False
) -> list[agl.Rollout]:
    """Run ``tasks`` with ``agent`` in two client worker processes through a server whose upstream is ``mock``
    (``chat_only``: served as a backend with chat completions only, as agl.train's are)."""
    settings = Settings(lease_seconds=10.0, rollout_timeout=150.0, max_attempts=1)
    with LightningServer(
        tmp_path / "server.db",
        upstream_url=mock.base_url,
        model_name="mock-model",
        model_version="v1",
        translate_responses=chat_only,
        settings=settings,
    ) as server:
        ids = server.enqueue(tasks)
        pool = start_workers(agent, server.url, nworkers=2, spool_dir=str(tmp_path / "spool"))
        try:
            return server.wait(ids, timeout=170)
        finally:
            server.request_stop()
            assert pool.wait(30)


def test_cli_agent_tool_loop_through_the_proxy(cli: str, tmp_path: Path, offline: Sink) -> None:
    with MockLLMServer(handler=coding_model) as mock:
        rollouts = _serve(getattr(command_agents, f"{cli}_agent"), tmp_path, mock, TASKS)
        forwarded = mock.requests
    _check_tool_loop(cli, rollouts, forwarded, offline)
    expected = "/v1/responses" if cli == "codex" else "/v1/chat/completions"  # Messages: always as chat
    assert {request.path for request in forwarded} == {expected}


def test_cli_agent_tool_loop_isolated(
    cli: str, tmp_path: Path, offline: Sink, bubblewrap: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same loop under ``isolated=True``: each agent runs in bubblewrap with a fresh HOME of its rollout (Codex's
    state goes to its default, ~/.codex, there) and the rest of the file system read-only."""
    monkeypatch.delenv("CODEX_HOME")
    with MockLLMServer(handler=coding_model) as mock:
        rollouts = _serve(getattr(command_agents, f"{cli}_isolated_agent"), tmp_path, mock, TASKS)
        forwarded = mock.requests
    _check_tool_loop(cli, rollouts, forwarded, offline)


def test_codex_on_a_chat_only_backend(tmp_path: Path, offline: Sink) -> None:
    """Codex speaks only the Responses API; the training backends serve chat completions: the proxy translates."""
    if not EXECUTABLES["codex"].exists():
        _missing("codex")
    with MockLLMServer(handler=coding_model) as mock:
        rollouts = _serve(command_agents.codex_agent, tmp_path, mock, TASKS, chat_only=True)
        forwarded = mock.requests
    _check_tool_loop("codex", rollouts, forwarded, offline)
    assert {request.path for request in forwarded} == {"/v1/chat/completions"}
    assert all(call.metadata["stream"] for rollout in rollouts for call in rollout.llm_calls)  # it streams


def thinking_model(request: MockRequest) -> MockReply:
    """:func:`coding_model` that thinks first, as a reasoning model behind vLLM's reasoning parser answers (its
    reasoning names the turn, so that the test can tell which answer the agent sent back)."""
    reply = coding_model(request)
    turn = sum(message.get("role") == "tool" for message in request.messages)
    return dataclasses.replace(reply, reasoning=f"Thinking about turn {turn}.")


def test_claude_code_sends_its_thinking_back(tmp_path: Path, offline: Sink) -> None:
    """Claude Code keeps the thinking blocks of the turns it continues (interleaved thinking with tools): the proxy
    gives them to the upstream as the assistant's reasoning_content, and they are in the recorded calls."""
    if not EXECUTABLES["claude"].exists():
        _missing("claude")
    with MockLLMServer(handler=thinking_model) as mock:
        rollouts = _serve(command_agents.claude_agent, tmp_path, mock, TASKS)
        forwarded = mock.requests
    _check_tool_loop("claude", rollouts, forwarded, offline)
    for rollout in rollouts:
        first, second, last = sorted(rollout.llm_calls, key=lambda call: call.start_time)
        assert [message.get("reasoning_content") for message in second.input if message["role"] == "assistant"] == [
            "Thinking about turn 0."
        ]
        sent_back = [message for message in last.input if message["role"] == "assistant"]
        assert [message.get("reasoning_content") for message in sent_back] == [
            "Thinking about turn 0.",
            "Thinking about turn 1.",
        ]
        for message in sent_back:
            [block] = message["thinking_blocks"]
            assert block["type"] == "thinking" and block["thinking"] == message["reasoning_content"]
            assert "signature" in block
        assert first.output["reasoning_content"] == "Thinking about turn 0."
        assert first.completion_token_ids[: len("Thinking")] == list(mock.tokenizer.encode("Thinking"))
    upstream_assistants = [m for r in forwarded for m in r.body["messages"] if m["role"] == "assistant"]
    assert upstream_assistants and all(m.get("reasoning_content") for m in upstream_assistants)


def _check_tool_loop(cli: str, rollouts: list[agl.Rollout], forwarded: list[MockRequest], offline: Sink) -> None:
    assert offline.seen == []  # nothing but the rollout's proxy was contacted
    for rollout in rollouts:
        assert rollout.status == "succeeded", "\n".join(rollout.logs)
    assert [rollout.final_reward for rollout in rollouts] == [1.0, 0.0]  # from answer.txt in each working directory
    calls = [call for rollout in rollouts for call in rollout.llm_calls]
    assert len(calls) == len(forwarded) == 6  # every request the agent sent went upstream once and is one call
    api = {"claude": "messages", "codex": "responses", "mini": "chat.completions"}[cli]
    for rollout in rollouts:
        first, second, last = sorted(rollout.llm_calls, key=lambda call: call.start_time)
        for call in (first, second, last):
            assert call.status == "ok" and call.token_source == "server", call
            assert call.prompt_token_ids and call.completion_token_ids
            assert call.metadata["model_version"] == "v1"
            assert call.metadata.get("api", call.metadata["endpoint"]) == api
            assert call.tools  # the agent's tool schemas
        written = first.output["tool_calls"][0]["function"]
        number = rollout.task["prompt"].split()[1]
        assert json.loads(written["arguments"])[SHELL_TOOLS[written["name"]]] == f"echo {number} > answer.txt"
        read = second.output["tool_calls"][0]["function"]
        assert json.loads(read["arguments"])[SHELL_TOOLS[read["name"]]] == "cat answer.txt"
        # The shell's output went back to the model as the tool result of the second call.
        results = [message for message in last.input if message.get("role") == "tool"]
        assert len(results) == 2 and number in str(results[1]["content"])
        assert last.output["content"] == "Done: the answer is in answer.txt."
    if cli == "mini":  # the submission ended its loop: nothing ran after it, and the trajectory says so
        assert all(not call.metadata["stream"] for call in calls)
        for rollout in rollouts:
            last = max(rollout.llm_calls, key=lambda call: call.start_time)
            assert json.loads(last.output["tool_calls"][0]["function"]["arguments"]) == {"command": MINI_SUBMIT}
            assert any("Saved trajectory to" in line for line in rollout.logs), rollout.logs
    if cli == "claude":  # Claude Code streams Messages; `--output-format json` reports what it got
        assert all(call.metadata["stream"] for call in calls)
        [result] = [json.loads(line.split(": ", 1)[1]) for line in rollouts[0].logs if line.startswith("stdout")]
        assert result["result"] == "Done: the answer is in answer.txt." and result["num_turns"] == 3


def _marked(marker: str) -> list[int]:
    """Live processes whose environment has AGL_CLI_TEST=<marker> (set on the agent's command only)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit() or f"AGL_CLI_TEST={marker}".encode() not in (entry / "environ").read_bytes():
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if state != "Z":
            pids.append(int(entry.name))
    return pids


def test_hung_cli_agent_is_killed_at_its_timeout(cli: str, tmp_path: Path, offline: Sink) -> None:
    agent = getattr(command_agents, f"{cli}_hung_agent")
    marker = f"{cli}-hung"
    assert _marked(marker) == []
    seen: set[int] = set()
    with MockLLMServer(handler=lambda request: MockReply(hang=True)) as mock:
        settings = Settings(lease_seconds=10.0, rollout_timeout=60.0, max_attempts=1)
        with LightningServer(tmp_path / "server.db", upstream_url=mock.base_url, settings=settings) as server:
            [rid] = server.enqueue([TASKS[0]])
            pool = start_workers(agent, server.url, nworkers=1, spool_dir=str(tmp_path / "spool"))
            try:
                deadline = time.monotonic() + 60
                while not server.store.finished({rid}):
                    seen.update(_marked(marker))
                    assert time.monotonic() < deadline, "the hung agent's rollout did not end"
                    time.sleep(0.1)
                [rollout] = server.wait([rid])
            finally:
                server.request_stop()
                assert pool.wait(30)
        asked = len(mock.requests)
    assert seen, "the agent's processes were never seen running"
    assert asked >= 1  # it was waiting on the model
    assert rollout.status == "failed" and rollout.error.type == "CommandError", rollout.error
    assert "did not finish within 8.0 s; its process group was killed" in rollout.error.message
    assert _marked(marker) == []  # nothing it started is left running
    assert offline.seen == []


def test_the_sink_catches_an_agent_that_reaches_for_its_vendor(tmp_path: Path, offline: Sink) -> None:
    """What the checks above rule out: Codex with its built-in OpenAI provider goes for api.openai.com, through the
    proxy variables to the sink, which refuses it at once; the command's timeout ends its retries."""
    if not EXECUTABLES["codex"].exists():
        _missing("codex")
    argv = [str(command_agents.CLI_AGENTS / "codex"), "exec", "--skip-git-repo-check", "{task[prompt]}"]
    agent = agl.CommandAgent(argv, env={"OPENAI_API_KEY": "unused"}, timeout=10)
    with MockLLMServer(handler=coding_model) as mock:
        [rollout] = agl.run(agent, [TASKS[0]], mock.llm())
        assert mock.requests == []  # it never used the endpoint it was given in OPENAI_BASE_URL
    assert rollout.status == "failed" and "did not finish within 10.0 s" in rollout.error.message
    assert any(seen.startswith("CONNECT api.openai.com:443") for seen in offline.seen), offline.seen
