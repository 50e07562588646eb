"""Run vLLM's OpenAI server, and stop its whole session when the process that started it dies.

``python -m agl_vllm_launch ARGS`` runs ``vllm.entrypoints.openai.api_server`` with ``ARGS`` in this process, plus a
thread that watches the trainer: when the process whose pid is in ``AGL_VLLM_PARENT_PID`` is gone (it died, even by
SIGKILL or the OOM killer: this process was re-parented, or, with a wrapper between them, the pid is gone), the
thread removes the directory in ``AGL_VLLM_OWNED_DIR`` (the backend's files, in ``/dev/shm`` for LoRA sync), sends
SIGTERM to this process group (the server's session: API server, engine core, workers), and SIGKILL to what is left
after :data:`GRACE` seconds. A trainer that stops normally stops the server itself first.

``os.getppid()`` changes when a parent dies on Linux and macOS (not on Windows, where vLLM does not run). Polling it
needs no file descriptor that a process the trainer forks could keep open, unlike a pipe, and a new process that
reuses the trainer's pid cannot hide its death (it can when a wrapper sits between them and only the pid is
watched).

The module imports nothing from Agent Lightning: the backend copies it next to the server's other files.
"""

from __future__ import annotations

import os
import runpy
import shutil
import signal
import sys
import threading
import time

POLL = 0.5
"""Seconds between looks at the parent pid."""
GRACE = 10.0
"""Seconds the server's processes get to exit after SIGTERM before SIGKILL."""


def parent_alive(parent_pid: int, direct: bool) -> bool:
    """Whether the trainer ``parent_pid`` still runs: while it is this process's parent (``direct``), as long as
    ``os.getppid()`` says so; if a wrapper (a shell script as ``vllm.python``) sits between, as long as the pid
    exists."""
    if direct:
        return os.getppid() == parent_pid
    try:
        os.kill(parent_pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, but is another user's
        return True
    return True


def watch_parent(parent_pid: int, owned_dir: str | None) -> None:
    """Block until the trainer ``parent_pid`` is gone, then stop the session (see the module)."""
    direct = os.getppid() == parent_pid
    while parent_alive(parent_pid, direct):
        time.sleep(POLL)
    print(f"agl: the trainer (pid {parent_pid}) is gone; stopping this vLLM server", file=sys.stderr, flush=True)
    if owned_dir:
        shutil.rmtree(owned_dir, ignore_errors=True)
    os.killpg(0, signal.SIGTERM)
    time.sleep(GRACE)
    os.killpg(0, signal.SIGKILL)


def main() -> None:
    parent = os.environ.get("AGL_VLLM_PARENT_PID")
    if parent:
        owned = os.environ.get("AGL_VLLM_OWNED_DIR")
        threading.Thread(target=watch_parent, args=(int(parent), owned), name="agl-parent-watch", daemon=True).start()
    sys.argv = ["vllm.entrypoints.openai.api_server", *sys.argv[1:]]
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
