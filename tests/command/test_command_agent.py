"""``agl.CommandAgent``: real processes as rollouts, under ``agl.run`` against the mock server and in client worker
processes and `agl client` through the server's per-rollout proxy (the Anthropic SDK there); timeouts kill the process
group."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import command_agents
import pytest

import agentlightning as agl
from agentlightning.client import start_workers
from agentlightning.server import LightningServer, Settings
from agentlightning.testing import MockLLMServer, MockReply, MockToolCall

SCRIPTS = Path(__file__).parent / "scripts"


def _misbehaving(*arguments: str, **options: object) -> agl.CommandAgent:
    return agl.CommandAgent([sys.executable, str(SCRIPTS / "misbehave.py"), *arguments], **options)  # type: ignore[arg-type]


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting for its reaper is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _gone(pids: list[int], within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while any(_alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_openai_script_under_agl_run(tmp_path: Path) -> None:
    agent = agl.CommandAgent(
        [sys.executable, str(SCRIPTS / "openai_agent.py"), "{task[question]}"], workdir_root=tmp_path / "runs"
    )
    (tmp_path / "runs").mkdir()
    tasks = [{"question": "capital of France?", "expect": "France"}, {"question": "2+2?", "expect": "five"}]
    with MockLLMServer() as mock:
        rollouts = agl.run(agent, tasks, mock.llm(), n_workers=2)
        asked = sorted(request.last_user_text for request in mock.requests)
    assert [r.status for r in rollouts] == ["succeeded", "succeeded"]
    assert [r.final_reward for r in rollouts] == [1.0, 0.0]
    assert asked == ["2+2?", "capital of France?"]  # through OPENAI_BASE_URL, the question from the placeholder
    logs = "\n".join(rollouts[0].logs)
    assert "model said: echo: capital of France?" in logs  # stdout tail
    assert "files here: ['answer.txt']" in logs  # stderr tail; a fresh, empty working directory
    assert list((tmp_path / "runs").iterdir()) == []  # removed after the reward


def test_anthropic_script_in_workers_through_the_proxy(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    replies = [
        MockReply(tool_calls=[MockToolCall(name="get_weather", arguments={"city": "Paris"})]),
        MockReply(content="It is sunny in Paris."),
    ]
    settings = Settings(lease_seconds=5.0, rollout_timeout=60.0)
    with (
        MockLLMServer(replies=replies) as mock,
        LightningServer(
            tmp_path / "s.db",
            upstream_url=mock.base_url,
            model_name="mock-model",
            model_version="v1",
            settings=settings,
        ) as server,
    ):
        [rid] = server.enqueue([{"expect": "sunny in Paris"}])
        pool = start_workers(command_agents.weather_agent, server.url, nworkers=1, spool_dir=str(tmp_path / "spool"))
        try:
            [rollout] = server.wait([rid], timeout=60)
        finally:
            server.request_stop()
            assert pool.wait(20)
    assert rollout.status == "succeeded", rollout.error
    assert rollout.final_reward == 1.0  # read from report.txt in the working directory
    calls = rollout.llm_calls
    assert len(calls) == 2 == len(mock.requests)  # every request the agent sent, recorded once
    assert all(call.metadata["api"] == "messages" and call.token_source == "server" for call in calls)
    assert all(call.completion_token_ids for call in calls)
    assert calls[0].output["tool_calls"][0]["function"]["name"] == "get_weather"
    assert any(message.get("role") == "tool" for message in calls[1].input)  # the tool result went back
    assert "What is the weather in Paris?" in str(calls[0].input)  # city.txt came from the template
    # Nothing is captured in-process on purpose: the proxy-only calls are not reported as missed by capture.
    assert not any(call.metadata.get("missed_by_capture") for call in calls)
    assert not [r for r in caplog.records if "in-process capture recorded" in r.getMessage()]
    assert not any("capture recorded" in note for note in rollout.diagnostics), rollout.diagnostics


def test_agl_client_runs_a_command_agent_by_reference(tmp_path: Path) -> None:
    tasks = [{"id": f"t{i}", "question": f"question {i}", "expect": f"question {i}"} for i in range(4)]
    dataset = tmp_path / "train.jsonl"
    dataset.write_text("".join(json.dumps(task) + "\n" for task in tasks))
    env = {**os.environ, "PYTHONPATH": f"{Path(__file__).parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    with MockLLMServer() as mock, LightningServer(tmp_path / "s.db", upstream_url=mock.base_url) as server:
        arguments = ["--agent", "command_agents:echo_agent", "--dataset", str(dataset), "--nworkers", "2"]
        client = subprocess.Popen(
            [sys.executable, "-m", "agentlightning._cli", "client", *arguments, "--server-url", server.url],
            env=env,
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        try:
            dataset_id = server.wait_for_dataset(timeout=60)
            rollouts = server.wait(server.enqueue(dataset_id), timeout=120)
            server.request_stop()
            assert client.wait(30) == 0, client.stdout.read().decode()[-3000:]
        finally:
            if client.poll() is None:
                os.killpg(client.pid, signal.SIGKILL)
    assert [r.status for r in rollouts] == ["succeeded"] * 4
    assert len(mock.requests) == 4
    for rollout in rollouts:
        assert rollout.final_reward == 1.0  # the last line the script printed
        [call] = rollout.llm_calls  # recorded by the proxy, with the upstream's token ids
        assert call.token_source == "server" and call.completion_token_ids
        assert call.output["content"] == f"echo: {rollout.task['question']}"


def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    agent = _misbehaving("hang", env={"PID_FILE": str(pid_file)}, timeout=1.5)
    started = time.monotonic()
    [rollout] = agl.run(agent, [{"n": 1}], agl.LLM(base_url="http://127.0.0.1:9/v1", model="m"))
    assert time.monotonic() - started < 10
    assert rollout.status == "failed" and rollout.error.type == "CommandError"
    assert "did not finish within 1.5 s; its process group was killed" in rollout.error.message
    assert any(line == "stdout (tail): hanging now\n" for line in rollout.logs)  # what it printed, kept
    pids = [int(pid) for pid in pid_file.read_text().split()]
    assert len(pids) == 2 and _gone(pids)  # the command and the child it started


def test_rollout_timeout_of_agl_run_kills_the_command(tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    agent = _misbehaving("hang", env={"PID_FILE": str(pid_file)})  # no timeout of its own
    [rollout] = agl.run(agent, [{"n": 1}], agl.LLM(base_url="http://127.0.0.1:9/v1", model="m"), timeout=1.5)
    assert rollout.status == "timeout"
    pids = [int(pid) for pid in pid_file.read_text().split()]
    assert len(pids) == 2 and _gone(pids)


def test_crash_fails_the_rollout_with_stderr_tail() -> None:
    [rollout] = agl.run(_misbehaving("crash"), [{"n": 1}], agl.LLM(base_url="http://127.0.0.1:9/v1", model="m"))
    assert rollout.status == "failed" and rollout.error.type == "CommandError"
    assert "exited with status 3" in rollout.error.message
    assert "RuntimeError: the agent broke on purpose" in rollout.error.message
    assert any("stdout (tail): starting" in line for line in rollout.logs)


@pytest.mark.parametrize(
    ("printed", "expected"),
    [("0.25", None), ("nan", "which is not finite"), ("done!", "ended with 'done!', not a number")],
)
def test_reward_from_the_last_line(printed: str, expected: str | None) -> None:
    [rollout] = agl.run(_misbehaving("print", printed), [{}], agl.LLM(base_url="http://127.0.0.1:9/v1", model="m"))
    if expected is None:
        assert rollout.status == "succeeded" and rollout.final_reward == 0.25
    else:
        assert rollout.status == "failed" and expected in rollout.error.message
        assert "the last line of its stdout is the reward" in rollout.error.message


def test_bad_arguments_are_clear() -> None:
    llm = agl.LLM(base_url="http://127.0.0.1:9/v1", model="m")
    [rollout] = agl.run(_misbehaving("print", "{task[missing]}"), [{"other": 1}], llm)
    assert rollout.status == "failed"
    message = rollout.error.message
    assert "argument '{task[missing]}' of agl.CommandAgent cannot be filled" in message
    assert message.endswith("there is no task[missing]")
    with pytest.raises(ValueError, match="must be an existing directory"):
        agl.CommandAgent(["true"], template="/no/such/dir")
    [missing] = agl.run(agl.CommandAgent(["/no/such/binary"]), [{}], llm)
    assert missing.status == "failed" and "could not be started" in missing.error.message


def test_environment_and_placeholders(tmp_path: Path) -> None:
    out = tmp_path / "env.txt"
    script = (
        "import os, sys; keys = ['OPENAI_BASE_URL', 'OPENAI_API_KEY', 'ANTHROPIC_BASE_URL', 'ANTHROPIC_API_KEY',"
        " 'AGL_MODEL', 'AGL_TASK', 'MINE']; open(sys.argv[1], 'w').write('\\n'.join(map(os.environ.get, keys)));"
        " print(sys.argv[2]); print(sys.argv[3] == os.getcwd()); print(sys.argv[4]); print(sys.argv[5]); print(1)"
    )
    arguments = [str(out), "{task}", "{workdir}", "{task[q]}-{task[n][1]}-{model}-{base_url}", '{"json": {task[n]}}']
    agent = agl.CommandAgent([sys.executable, "-c", script, *arguments], env={"MINE": "yes"})
    llm = agl.LLM(base_url="http://127.0.0.1:9/v1/", model="served", api_key="k")
    [rollout] = agl.run(agent, [{"q": "x", "n": [1, 2]}], llm)
    assert rollout.status == "succeeded" and rollout.final_reward == 1.0
    assert out.read_text().split("\n") == [
        "http://127.0.0.1:9/v1",
        "k",
        "http://127.0.0.1:9",
        "k",
        "served",
        '{"q": "x", "n": [1, 2]}',
        "yes",
    ]
    assert (
        'stdout (tail): {"q": "x", "n": [1, 2]}\nTrue\nx-2-served-http://127.0.0.1:9/v1\n{"json": [1, 2]}\n1'
        in "\n".join(rollout.logs)
    )


def test_training_without_the_server_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("torch")  # agl.train needs the [train] extra (not in the lowest-versions job)
    agent = agl.CommandAgent(["true"])
    started = time.perf_counter()
    with pytest.raises(ValueError, match="only the server's per-rollout proxy can record its LLM calls"):
        agl.train(agent, [{"q": 1}], model="tiny", use_server=False, output_dir=str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()  # refused before a model loaded or a rollout ran
    assert time.perf_counter() - started < 60


@pytest.mark.usefixtures("bubblewrap")
def test_an_isolated_command_writes_only_its_own_directories_and_sees_only_its_processes(tmp_path: Path) -> None:
    """Outside its directories the file system is read-only (a directory under /var/tmp) or, under /tmp, not there."""
    runs, hidden = tmp_path / "runs", tmp_path / "hidden"
    runs.mkdir()
    hidden.mkdir()
    outside = Path(tempfile.mkdtemp(dir="/var/tmp"))
    agent = agl.CommandAgent(
        [sys.executable, str(SCRIPTS / "sandbox_probe.py")],
        env={"OUTSIDE": str(outside), "HIDDEN": str(hidden), "WATCHER_PID": str(os.getpid())},
        isolated=True,
        workdir_root=runs,
        keep_workdirs=True,
    )
    try:
        [rollout] = agl.run(agent, [{"n": 1}], agl.LLM(base_url="http://127.0.0.1:9/v1", model="m"))
        assert not list(outside.iterdir()) and not list(hidden.iterdir())
    finally:
        shutil.rmtree(outside)
    assert rollout.status == "succeeded" and rollout.final_reward == 1.0, rollout.error
    [workdir] = runs.glob("*/work")
    report = json.loads((workdir / "report.json").read_text())
    assert report["cwd"] == str(workdir)
    assert report["outside"] == "OSError: Read-only file system"
    assert report["hidden"] == "FileNotFoundError: No such file or directory"
    assert not Path(report["tmp_file"]).exists()  # its /tmp was its own
    assert report["home"] == str(workdir.parent / "home") and (workdir.parent / "home" / ".config" / "agent").is_dir()
    assert report["watcher"] == "not visible" and len(report["processes"]) < 5


@pytest.mark.usefixtures("bubblewrap")
def test_an_isolated_command_of_a_project_under_tmp_runs_and_cannot_write_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The private /tmp hid a project checked out under /tmp, and with it the command's own script (a clone in /tmp
    failed every isolated test with 'bwrap: execvp ...: No such file or directory'). The directory the run started
    from is visible, read-only."""
    project = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        (project / "agent.py").write_text(
            "import pathlib\n"
            "try:\n"
            "    (pathlib.Path(__file__).parent / 'written').write_text('x')\n"
            "    print('wrote its project')\n"
            "except OSError as exc:\n"
            "    print(exc.strerror)\n"
            "print(1)\n"
        )
        monkeypatch.chdir(project)
        python = Path(sys.executable).resolve()  # the interpreter itself: a virtual environment may be under /tmp too
        agent = agl.CommandAgent([str(python), str(project / "agent.py")], isolated=True, workdir_root=tmp_path)
        [rollout] = agl.run(agent, [{"n": 1}], agl.LLM(base_url="http://127.0.0.1:9/v1", model="m"))
        assert rollout.status == "succeeded" and rollout.final_reward == 1.0, rollout.error
        assert "stdout (tail): Read-only file system\n1\n" in rollout.logs, rollout.logs
        assert not (project / "written").exists()
    finally:
        shutil.rmtree(project)


@pytest.mark.usefixtures("bubblewrap")
def test_an_isolated_command_timing_out_takes_even_its_escaped_processes_with_it(tmp_path: Path) -> None:
    marker = f"agl-escape-{os.getpid()}-{time.monotonic_ns()}"
    agent = _misbehaving("escape", marker, isolated=True, timeout=1.5)
    [rollout] = agl.run(agent, [{"n": 1}], agl.LLM(base_url="http://127.0.0.1:9/v1", model="m"))
    assert rollout.status == "failed" and "did not finish within 1.5 s" in rollout.error.message
    assert any(line == "stdout (tail): escaped\n" for line in rollout.logs)

    def escaped() -> list[str]:
        return [path.parent.name for path in Path("/proc").glob("[0-9]*/cmdline") if marker in _read(path)]

    deadline = time.monotonic() + 5
    while escaped() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert escaped() == []


def _read(path: Path) -> str:
    try:
        return path.read_bytes().decode(errors="replace")
    except OSError:  # the process ended meanwhile
        return ""


def test_isolation_without_bubblewrap_is_refused_naming_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(agl.CommandError, match="apt-get install bubblewrap"):
        agl.CommandAgent(["true"], isolated=True)
