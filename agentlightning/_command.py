"""``agl.CommandAgent``: a command-line agent (any program, any language) as a rollout. Each rollout runs the command
once in a fresh working directory, with the rollout's LLM endpoint in its environment, and scores what it left."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentlightning._decorator import RolloutAgent
from agentlightning.errors import CommandError
from agentlightning.types import LLM, Rollout

logger = logging.getLogger(__name__)

_PLACEHOLDER = re.compile(r"\{(?P<name>task|workdir|model|base_url)(?P<keys>(?:\[[^\]]*\])*)\}")

TAIL_BYTES = 8192  # how much of stdout / stderr each rollout keeps
_POLL_SECONDS = 0.05  # how often a running command is checked for its deadline and for an abandoned rollout
_COMMAND_VARIABLE = "AGL_COMMAND"  # the command of `agl train --command`, for its worker processes
_ISOLATED_VARIABLE = "AGL_COMMAND_ISOLATED"  # "1" with `agl train --command ... --isolated`


@dataclass(frozen=True)
class CommandResult:
    """How one run of the command ended: what a ``reward(task, workdir, result)`` function is given."""

    argv: list[str]
    returncode: int
    stdout: str  # the last TAIL_BYTES of what it printed
    stderr: str
    duration: float  # seconds


class CommandAgent(RolloutAgent):
    """A command-line agent usable wherever an ``@agl.rollout`` agent is (``agl.run``, ``agl.train``, client
    workers). Per rollout the command runs in a fresh directory (a copy of ``template``, or empty) in a process group
    of its own, with stdin closed and these variables set (over ``env`` and this process's environment):

    - ``OPENAI_BASE_URL``, ``OPENAI_API_KEY``: the rollout's ``llm`` (``.../v1``);
    - ``ANTHROPIC_BASE_URL``, ``ANTHROPIC_API_KEY``: the same endpoint without ``/v1`` (Anthropic SDKs add it);
    - ``AGL_MODEL``: the model name to send; ``AGL_TASK``: the task as JSON; ``AGL_WORKDIR``: the directory.

    Arguments may hold placeholders, filled per rollout: ``{task}``, ``{task[key]}`` (or ``{task[key][0]}``...: a
    string as it is, anything else as JSON), ``{workdir}``, ``{model}``, ``{base_url}`` (``OPENAI_BASE_URL``, for a
    CLI that takes its endpoint as an option); other braces are left as they are. ``argv``
    may also be one shell-like command line (split with :func:`shlex.split`, not run by a shell).

    - ``reward``: ``reward(task, workdir, result) -> float`` called after a successful exit (``workdir`` a
      :class:`~pathlib.Path`, ``result`` a :class:`CommandResult`); without it the last non-empty line of stdout
      must be the reward (a finite float);
    - ``timeout``: seconds before the whole process group is killed (the rollout fails with a ``CommandError``);
      a rollout timeout of ``agl.run`` / the server kills it too;
    - ``workdir_root``: where rollout directories are made (default: the system temp dir); ``keep_workdirs``: leave
      them there after the rollout (default: removed once the reward is computed);
    - ``isolated``: run the command under bubblewrap (``bwrap``, Linux): the whole file system read-only but for the
      rollout's working directory, a private ``/tmp`` and a fresh ``HOME`` (empty, per rollout), in a PID namespace
      of its own (it sees and signals only its own processes, and all of them end with it, even those that left
      its process group). The network is shared: the rollout's proxy is on this machine's loopback.

    A non-zero exit fails the rollout with the tail of stderr in its error; the tails of stdout and stderr are kept
    in the rollout's logs either way.
    """

    def __init__(
        self,
        argv: Sequence[str] | str,
        *,
        env: Mapping[str, str] | None = None,
        template: str | os.PathLike[str] | None = None,
        reward: Callable[[Any, Path, CommandResult], float] | None = None,
        timeout: float | None = None,
        roles: Sequence[str] | None = None,
        name: str | None = None,
        workdir_root: str | os.PathLike[str] | None = None,
        keep_workdirs: bool = False,
        isolated: bool = False,
    ) -> None:
        self.argv = _checked_argv(argv)
        if isolated and shutil.which("bwrap") is None:
            raise CommandError(
                "agl.CommandAgent(isolated=True) runs the command under bubblewrap, and there is no `bwrap` on PATH: "
                "install it (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap)"
            )
        self.isolated = isolated
        self.env = _checked_env(env)
        self.template = None if template is None else Path(template)
        if self.template is not None and not self.template.is_dir():
            raise ValueError(f"agl.CommandAgent(template=...) must be an existing directory, got {str(template)!r}")
        if reward is not None and not callable(reward):
            raise TypeError(f"agl.CommandAgent(reward=...) must be a function (task, workdir, result), got {reward!r}")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
            raise ValueError(f"agl.CommandAgent(timeout=...) must be a positive number of seconds, got {timeout!r}")
        self.command_reward = reward
        self.timeout = None if timeout is None else float(timeout)
        self.workdir_root = None if workdir_root is None else Path(workdir_root)
        self.keep_workdirs = keep_workdirs
        super().__init__(self._run_rollout, roles=roles, name=name or Path(self.argv[0]).name)
        # Worker processes import an agent by reference: this one is a module-level name where it was created
        # (as collections.namedtuple does for pickling).
        self.__module__ = sys._getframe(1).f_globals.get("__name__", "__main__")
        self.__qualname__ = self.name

    def __repr__(self) -> str:
        return f"<agl.CommandAgent {shlex.join(self.argv)!r} roles={self.roles}>"

    def _run_rollout(self, task: Any, llm: LLM, rollout: Rollout) -> float:
        root = Path(tempfile.mkdtemp(prefix=f"agl-{rollout.rollout_id}-", dir=self.workdir_root))
        workdir = root / "work"
        try:
            if self.template is not None:
                shutil.copytree(self.template, workdir, symlinks=True)
            else:
                workdir.mkdir()
            argv = self._filled_argv(task, workdir, llm)
            env = self._environment(task, workdir, llm)
            sandbox: list[str] = []
            if self.isolated:
                home = root / "home"
                home.mkdir()
                env.update(HOME=str(home), TMPDIR="/tmp")
                sandbox = _bubblewrap(workdir, home)
            result, timed_out = _run(argv, env, workdir, root, self.timeout, rollout, sandbox)
            rollout.logs.append(f"command {shlex.join(argv)} in {workdir}: exit {result.returncode}")
            rollout.logs += [f"stdout (tail): {result.stdout}", f"stderr (tail): {result.stderr}"]
            if timed_out:
                raise CommandError(
                    f"command {shlex.join(argv)} did not finish within {self.timeout} s; its process group was killed."
                    f" stderr (tail): {result.stderr.strip() or '(empty)'}"
                )
            if result.returncode != 0:
                raise CommandError(
                    f"command {shlex.join(argv)} exited with status {result.returncode} after {result.duration:.1f} s;"
                    f" stderr (tail): {result.stderr.strip() or '(empty)'}"
                )
            if self.command_reward is not None:
                return self.command_reward(task, workdir, result)
            return _last_line_reward(argv, result)
        finally:
            if self.keep_workdirs:
                rollout.logs.append(f"working directory kept: {workdir}")
            else:
                shutil.rmtree(root, ignore_errors=True)

    def _filled_argv(self, task: Any, workdir: Path, llm: LLM) -> list[str]:
        def fill(match: re.Match[str]) -> str:
            if match["name"] != "task":
                if match["keys"]:  # {workdir[...]}: not a placeholder
                    return match[0]
                values = {"workdir": str(workdir), "model": llm.model, "base_url": llm.base_url.rstrip("/")}
                return values[match["name"]]
            value = task
            try:
                for key in re.findall(r"\[([^\]]*)\]", match["keys"]):
                    value = value[int(key)] if isinstance(value, list) and key.lstrip("-").isdigit() else value[key]
            except (KeyError, IndexError, TypeError):
                raise KeyError(match[0][1:-1]) from None
            return value if isinstance(value, str) else json.dumps(value)

        filled = []
        for argument in self.argv:
            try:
                filled.append(_PLACEHOLDER.sub(fill, argument))
            except KeyError as exc:
                raise CommandError(
                    f"argument {argument!r} of agl.CommandAgent cannot be filled from the task {json.dumps(task)}: "
                    f"there is no {exc.args[0]}"
                ) from None
        return filled

    def _environment(self, task: Any, workdir: Path, llm: LLM) -> dict[str, str]:
        key = llm.api_key or "agl"
        base_url = llm.base_url.rstrip("/")
        inherited = {name: value for name, value in os.environ.items() if name != "AGL_SERVER_TOKEN"}
        return {
            **inherited,  # the server's token stays with the worker: the command gets its rollout's own key
            **self.env,
            "OPENAI_BASE_URL": base_url,
            "OPENAI_API_KEY": key,
            "ANTHROPIC_BASE_URL": base_url.removesuffix("/v1"),
            "ANTHROPIC_API_KEY": key,
            "AGL_MODEL": llm.model,
            "AGL_TASK": json.dumps(task),
            "AGL_WORKDIR": str(workdir),
        }


def command_line_agent(command: str, isolated: bool = False) -> CommandAgent:
    """The agent of ``agl train --command COMMAND [--isolated]``. Worker processes import agents by reference, so
    the command travels in ``AGL_COMMAND`` (and ``AGL_COMMAND_ISOLATED``; set here, inherited by the workers) and
    ``agentlightning._command:cli_agent`` names the agent built from it."""
    os.environ[_COMMAND_VARIABLE] = command
    os.environ[_ISOLATED_VARIABLE] = "1" if isolated else "0"
    globals().pop("cli_agent", None)
    agent: CommandAgent = __getattr__("cli_agent")
    return agent


def __getattr__(name: str) -> Any:
    """``cli_agent``: the :class:`CommandAgent` of the command in ``AGL_COMMAND`` (built once per process)."""
    if name != "cli_agent":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    command = os.environ.get(_COMMAND_VARIABLE)
    if not command:
        raise AttributeError(f"{__name__}.cli_agent: {_COMMAND_VARIABLE} is not set (agl train --command sets it)")
    isolated = os.environ.get(_ISOLATED_VARIABLE) == "1"
    agent = globals()["cli_agent"] = CommandAgent(command, isolated=isolated)
    return agent


def _bubblewrap(workdir: Path, home: Path) -> list[str]:
    """The bubblewrap command a command runs under when isolated: only ``workdir``, ``home`` and a private /tmp
    writable, a PID namespace of its own (whose processes all end when its first one does). The directory the run
    was started from stays visible (read-only, as the rest of the file system) when it is under /tmp, so that a
    project checked out there, its virtual environment included, still runs."""
    sandbox = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    started_in = Path.cwd()
    if started_in.is_relative_to("/tmp") and started_in != Path("/tmp"):
        sandbox += ["--ro-bind", str(started_in), str(started_in)]
    sandbox += ["--bind", str(workdir), str(workdir), "--bind", str(home), str(home)]
    return sandbox + ["--unshare-pid", "--die-with-parent", "--chdir", str(workdir), "--"]


def _run(
    argv: list[str],
    env: dict[str, str],
    workdir: Path,
    root: Path,
    timeout: float | None,
    rollout: Rollout,
    sandbox: Sequence[str] = (),
) -> tuple[CommandResult, bool]:
    """Run ``argv`` (under the ``sandbox`` command, if any) to its end in a new session (its own process group) with
    output to files under ``root``; kill the whole group at ``timeout``, when the rollout stops running (timed out or
    taken away), and after it exits (so nothing it started outlives the rollout). Returns how it ended and whether
    ``timeout`` ended it."""
    started, timed_out = time.monotonic(), False
    with open(root / "stdout", "wb") as stdout, open(root / "stderr", "wb") as stderr:
        try:
            process = subprocess.Popen(
                [*sandbox, *argv],
                cwd=workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,
            )
        except OSError as exc:
            raise CommandError(f"command {shlex.join(argv)} could not be started: {exc}") from None
        try:
            while process.poll() is None:
                if timeout is not None and time.monotonic() - started >= timeout:
                    timed_out = True
                    break
                if rollout.status != "running":  # the attempt gave up on this rollout (its own timeout, cancelled)
                    logger.warning("rollout %s is %s; killing its command", rollout.rollout_id, rollout.status)
                    break
                time.sleep(_POLL_SECONDS)
        finally:
            _kill_group(process)
    result = CommandResult(
        argv=argv,
        returncode=process.returncode,
        stdout=_tail(root / "stdout"),
        stderr=_tail(root / "stderr"),
        duration=time.monotonic() - started,
    )
    return result, timed_out


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL every process left in ``process``'s group, then reap ``process`` itself."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # the group is gone already
        pass
    process.wait()


def _tail(path: Path) -> str:
    with open(path, "rb") as file:
        file.seek(max(0, file.seek(0, os.SEEK_END) - TAIL_BYTES))
        return file.read().decode("utf-8", errors="replace")


def _last_line_reward(argv: list[str], result: CommandResult) -> float:
    lines = [line.strip() for line in result.stdout.splitlines() if line.strip()]
    where = f"command {shlex.join(argv)} (no reward= function given, so the last line of its stdout is the reward)"
    if not lines:
        raise CommandError(f"{where} printed nothing")
    try:
        value = float(lines[-1])
    except ValueError:
        raise CommandError(f"{where} ended with {lines[-1][:200]!r}, not a number") from None
    if not math.isfinite(value):
        raise CommandError(f"{where} printed the reward {lines[-1]!r}, which is not finite")
    return value


def _checked_argv(argv: Sequence[str] | str) -> list[str]:
    words = shlex.split(argv) if isinstance(argv, str) else argv
    if isinstance(words, (bytes, Mapping)) or not all(isinstance(word, str) for word in words) or not words:
        raise TypeError(
            f"agl.CommandAgent(argv=...) must be a non-empty list of strings or a command line, got {argv!r}"
        )
    return list(words)


def _checked_env(env: Mapping[str, str] | None) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise TypeError(f"agl.CommandAgent(env=...) must map variable names to strings, got {env!r}")
    return dict(env)


__all__ = ["CommandAgent", "CommandError", "CommandResult"]
