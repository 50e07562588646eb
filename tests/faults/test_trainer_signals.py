"""SIGTERM, SIGHUP and SIGKILL sent to a real ``agl train`` process (the tiny model; the HF backend, and vLLM's CPU
build): everything it started stops. Issue 37, item 2 (a SIGTERM'd trainer orphaned its vLLM server, its agent
workers and ``/dev/shm/agl-vllm-*``); issue 36, item 5's tail.

Each run trains ``fault_agents:fault_agent`` in "hold" mode with two workers: the test signals the trainer once both
workers hold a rollout, then counts what is left of the trainer's process group (the workers, multiprocessing's
resource tracker) and of the vLLM server's session (API server, engine core).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from _harness import agl, free_port, group_survivors, session_survivors
from polling import wait_for
from vllm_venv import require_vllm

pytest.importorskip("torch")
from agentlightning.trainers.models import tiny_model  # noqa: E402

from agentlightning.server import SQLiteStore  # noqa: E402

logger = logging.getLogger(__name__)

LORA = json.dumps({"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]})
VLLM_OPTIONS = [
    "--backend",
    "vllm",
    "--lora",
    LORA,
    "--set",
    "vllm.dtype=float32",
    "--set",
    "vllm.max_model_len=512",
    "--set",
    'vllm.env={"VLLM_CPU_KVCACHE_SPACE": "1"}',
    "--set",
    "vllm.startup_timeout=400",
]


class Trainer:
    """A running ``agl train`` whose output a thread keeps (so the pipe never fills)."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process
        self.lines: list[str] = []
        self.sessions: set[int] = set()  # of the children found in a session of their own, killed on the way out
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.decode(errors="replace"))

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def children_in_own_session(self) -> list[int]:
        """Pids of the trainer's children that run in a session of their own (a vLLM server it started)."""
        found = subprocess.run(
            ["ps", "-o", "pid=,sid=", "--ppid", str(self.process.pid)], capture_output=True, text=True
        ).stdout
        rows = [tuple(map(int, line.split())) for line in found.splitlines() if line.strip()]
        leaders = [pid for pid, sid in rows if pid == sid]
        self.sessions.update(leaders)
        return leaders


def tiny_model_dir(tmp_path: Path, hidden_size: int = 32) -> Path:
    """The tiny random model and its tokenizer, saved (``agl train --model DIR``)."""
    model_dir = tmp_path / "tiny"
    model, tokenizer = tiny_model(seed=5, hidden_size=hidden_size)
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    return model_dir


@contextmanager
def holding_trainer(tmp_path: Path, *options: str, hidden_size: int = 32) -> Iterator[Trainer]:
    """``agl train`` (in its own session) of ``fault_agent`` on 2 tasks x 2 rollouts that hold until
    ``tmp_path/release`` exists, yielded once both workers hold one; its session is killed on the way out."""
    model_dir = tiny_model_dir(tmp_path, hidden_size)
    holding = tmp_path / "holding"
    holding.mkdir()
    hold = {"mode": "hold", "release": str(tmp_path / "release"), "holding": str(holding)}
    dataset = tmp_path / "train.jsonl"
    dataset.write_text("".join(json.dumps({"id": f"t{i}", "question": f"q{i}", **hold}) + "\n" for i in range(2)))
    process = agl(
        "train",
        "fault_agents:fault_agent",
        "--dataset",
        str(dataset),
        "--model",
        str(model_dir),
        "--group-size",
        "2",
        "--tasks-per-step",
        "2",
        "--max-steps",
        "1",
        "--max-completion-length",
        "4",
        "--nworkers",
        "2",
        "--no-progress",
        "--no-save-model",
        "--output-dir",
        str(tmp_path / "run"),
        "--log-level",
        "WARNING",
        *options,
    )
    trainer = Trainer(process)
    try:
        wait_for(lambda: len(list(holding.iterdir())) >= 2 or process.poll() is not None, 400, "both workers to hold")
        assert process.poll() is None, trainer.output[-3000:]
        yield trainer
    finally:
        for pid in [process.pid, *trainer.sessions]:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        process.wait(10)


def store_counts(tmp_path: Path) -> dict[str, int]:
    store = SQLiteStore(tmp_path / "run" / "store.db")
    try:
        return store.counts()
    finally:
        store.close()


def vllm_owned_dir(pid: int) -> Path:
    """The temporary directory of the vLLM server ``pid`` (its launcher's ``AGL_VLLM_OWNED_DIR``)."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    (entry,) = [item for item in environ if item.startswith(b"AGL_VLLM_OWNED_DIR=")]
    return Path(entry.split(b"=", 1)[1].decode())


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_or_sighup_to_agl_train_stops_it_as_ctrl_c_does(tmp_path: Path, signum: signal.Signals) -> None:
    """Sent to the trainer's PID (``kill PID``; a closed terminal): as with Ctrl-C, the rollouts of the unfinished
    step are cancelled (none is left queued or running for a resumed run to pick up), the workers exit, and the
    trainer exits with 128 + the signal's number."""
    with holding_trainer(tmp_path) as trainer:
        assert len(group_survivors(trainer.process.pid)) >= 3  # the trainer and its two workers at least
        trainer.process.send_signal(signum)
        sent = time.monotonic()
        wait_for(lambda: "stopping what it started" in trainer.output, 30, "the trainer to start stopping")
        (tmp_path / "release").touch()  # the agents holding return (their results are refused: cancelled)
        code = trainer.process.wait(90)
        logger.warning("agl train exited %.1f s after %s", time.monotonic() - sent, signum.name)
        assert code == 128 + signum, trainer.output[-3000:]
        wait_for(lambda: f"agl train: stopped by {signum.name}" in trainer.output, 5, "the trainer's last line")
        # multiprocessing's resource tracker may still be exiting for a moment after the trainer; a worker never ends
        wait_for(lambda: not group_survivors(trainer.process.pid), 10, "the trainer's process group to be gone")
    assert store_counts(tmp_path) == {"cancelled": 4}


@pytest.mark.slow
def test_sigterm_to_agl_server_model_stops_it_and_frees_its_port(tmp_path: Path) -> None:
    """``agl server --model`` waiting for a client to attach a dataset: SIGTERM stops the server (its port free
    again) and it exits 143, as Ctrl-C would stop it."""
    port = free_port()
    process = agl(
        "server",
        "--model",
        str(tiny_model_dir(tmp_path)),
        "--port",
        str(port),
        "--store",
        str(tmp_path / "store.db"),
        "--output-dir",
        str(tmp_path / "run"),
        "--log-level",
        "WARNING",
    )
    server = Trainer(process)
    try:
        wait_for(lambda: "waiting for a client" in server.output or process.poll() is not None, 120, "the server")
        assert process.poll() is None, server.output[-3000:]
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 128 + signal.SIGTERM, server.output[-3000:]
        wait_for(lambda: "agl server: stopped by SIGTERM" in server.output, 5, "the server's last line")
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", port))
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


@pytest.mark.slow
def test_workers_of_a_sigkilled_agl_train_exit_on_their_own(tmp_path: Path) -> None:
    """SIGKILL (or the OOM killer) runs no clean-up: each worker sees its parent gone, gives up the rollout it holds
    at its next heartbeat and exits, instead of retrying the vanished server for 10 minutes."""
    with holding_trainer(tmp_path) as trainer:
        assert len(group_survivors(trainer.process.pid)) >= 3
        os.kill(trainer.process.pid, signal.SIGKILL)
        trainer.process.wait(10)
        killed = time.monotonic()
        wait_for(lambda: not group_survivors(trainer.process.pid), 45, "the orphaned workers to exit")
        logger.warning("workers of a SIGKILLed trainer gone %.1f s after the kill", time.monotonic() - killed)


@pytest.mark.slow
def test_sigterm_to_the_group_of_agl_train_on_vllm_stops_the_vllm_server_and_removes_its_files(
    tmp_path: Path,
) -> None:
    """As a process manager stops a service: SIGTERM to the trainer's process group. The vLLM server runs in a
    session of its own, which the signal does not reach; the trainer stops it, and removes its /dev/shm files."""
    require_vllm()
    with holding_trainer(tmp_path, *VLLM_OPTIONS, hidden_size=256) as trainer:
        (server,) = trainer.children_in_own_session()
        files = vllm_owned_dir(server)
        assert files.is_dir() and len(session_survivors(server)) >= 2  # the API server and its engine core
        os.killpg(trainer.process.pid, signal.SIGTERM)
        sent = time.monotonic()
        wait_for(lambda: "stopping what it started" in trainer.output, 30, "the trainer to start stopping")
        (tmp_path / "release").touch()
        assert trainer.process.wait(120) == 128 + signal.SIGTERM, trainer.output[-3000:]
        logger.warning("agl train on vLLM exited %.1f s after SIGTERM to its group", time.monotonic() - sent)
        assert not session_survivors(server), session_survivors(server)
        assert not files.exists()
        wait_for(lambda: not group_survivors(trainer.process.pid), 10, "the trainer's process group to be gone")


@pytest.mark.slow
def test_the_vllm_server_of_a_sigkilled_agl_train_stops_itself_and_removes_its_files(tmp_path: Path) -> None:
    """Its launcher sees the trainer gone, removes the server's files and stops the server's whole session."""
    require_vllm()
    with holding_trainer(tmp_path, *VLLM_OPTIONS, hidden_size=256) as trainer:
        (server,) = trainer.children_in_own_session()
        files = vllm_owned_dir(server)
        os.kill(trainer.process.pid, signal.SIGKILL)
        trainer.process.wait(10)
        killed = time.monotonic()
        wait_for(lambda: not session_survivors(server), 30, "the vLLM server's session to be gone")
        logger.warning("vLLM session of a SIGKILLed trainer gone %.1f s after the kill", time.monotonic() - killed)
        assert not files.exists()
        wait_for(lambda: not group_survivors(trainer.process.pid), 45, "the orphaned workers to exit")
