"""The launcher of a vLLM server started by ``VLLMBackend`` (``trainers/backends/vllm/_launch.py``), without vLLM: a
stand-in ``vllm.entrypoints.openai.api_server`` that spawns an "engine" process, as vLLM's does, and sleeps. When the
"trainer" that started it is SIGKILLed, the launcher removes the server's files and ends the server's session, also
when a wrapper script (a ``vllm.python`` that does not ``exec``) sits between them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from agentlightning.trainers.backends.vllm import server as vllm_server
from polling import wait_for

STAND_IN = """import multiprocessing, sys, time

def engine():
    time.sleep(300)

if __name__ == "__main__":
    multiprocessing.get_context("spawn").Process(target=engine).start()
    print("serving", *sys.argv[1:], flush=True)
    time.sleep(300)
"""

TRAINER = """import os, subprocess, sys, time

owned, command = sys.argv[1], sys.argv[2:]
env = {**os.environ, "AGL_VLLM_PARENT_PID": str(os.getpid()), "AGL_VLLM_OWNED_DIR": owned}
server = subprocess.Popen(command, env=env, start_new_session=True, stdout=open(os.path.join(owned, "log"), "w"))
print(server.pid, flush=True)
time.sleep(300)
"""


def _session(sid: int) -> list[str]:
    found = subprocess.run(["ps", "-o", "stat=,pid=,args=", "-s", str(sid)], capture_output=True, text=True).stdout
    return [line for line in found.splitlines() if not line.lstrip().startswith("Z")]


@pytest.mark.skipif(sys.platform == "win32", reason="sessions and re-parenting are POSIX")
@pytest.mark.parametrize("wrapped", [False, True], ids=["direct", "wrapper-script"])
def test_the_server_session_ends_when_its_trainer_is_sigkilled(tmp_path: Path, wrapped: bool) -> None:
    package = tmp_path / "path" / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True)
    for folder in (package, package.parent, package.parent.parent):
        (folder / "__init__.py").write_text("")
    (package / "api_server.py").write_text(STAND_IN)
    owned = tmp_path / "agl-vllm-files"
    owned.mkdir()
    (owned / f"{vllm_server.LAUNCHER}.py").write_text(Path(vllm_server.__file__).with_name("_launch.py").read_text())
    command = [sys.executable, "-m", vllm_server.LAUNCHER, "--port", "1"]
    if wrapped:  # a shell that waits for python instead of exec-ing it (the "; true" keeps it from exec-ing)
        command = ["sh", "-c", '"$0" "$@"; true', *command]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "path"), str(owned)])}
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, str(owned), *command], env=env, stdout=subprocess.PIPE, text=True
    )
    server = None
    try:
        server = int(trainer.stdout.readline())
        wait_for(lambda: "serving --port 1" in (owned / "log").read_text(), 60, "the stand-in server to start")
        assert len(_session(server)) >= (3 if wrapped else 2)  # launcher (+ shell) + the spawned engine
        trainer.kill()
        trainer.wait(10)
        killed = time.monotonic()
        wait_for(lambda: not _session(server), 20, "the server's session to be gone")
        assert time.monotonic() - killed < 8.0  # SIGTERM ended it (SIGKILL would come after GRACE, 10 s)
        assert not owned.exists()
    finally:
        trainer.kill()
        if server is not None and _session(server):
            os.killpg(server, signal.SIGKILL)
