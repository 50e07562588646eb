"""``agl server --model DIR``: the server trains on rollouts run by a remote ``agl.Client``."""

from __future__ import annotations

import argparse
import json
import socket
import threading

import pytest
from agentlightning.trainers.models import tiny_model
from agentlightning.trainers.serve import serve_training
from train_agents import echo_length_agent

import agentlightning as agl
from agentlightning._cli import add_server_arguments, server_from_args


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("staleness", [0, 1], ids=["sync", "async"])
def test_server_with_model_trains_on_client_rollouts(tmp_path, staleness):
    model, tokenizer = tiny_model(seed=4)
    model.save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    port = _free_port()
    parser = argparse.ArgumentParser()
    add_server_arguments(parser)
    args = parser.parse_args(
        [
            "--port",
            str(port),
            "--store",
            str(tmp_path / "store.db"),
            "--model",
            str(tmp_path / "tiny"),
            "--max-steps",
            "2",
            "--group-size",
            "2",
            "--tasks-per-step",
            "2",
            "--learning-rate",
            "0.01",
            "--max-completion-length",
            "6",
            "--output-dir",
            str(tmp_path / "out"),
            "--set",
            f"max_staleness={staleness}",
        ]
    )
    outcome: dict[str, int] = {}
    server = threading.Thread(
        target=lambda: outcome.update(code=serve_training(server_from_args(args), args)), daemon=True
    )
    server.start()

    tasks = [{"id": f"t{i}", "question": f"{i} * 2?"} for i in range(3)]
    agl.Client(f"http://127.0.0.1:{port}").train(echo_length_agent, dataset=tasks, nworkers=2)
    server.join(timeout=120)

    assert outcome.get("code") == 0
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]
    if staleness:  # the remote clients ran the next step's groups ahead; groups without signal were refilled
        assert all(row["llm_calls"] >= 4 and row["async/staleness_max"] <= 1 for row in rows)
        first = rows[0]  # two steps' groups were submitted at once: used, set aside (no signal) or still queued
        assert first["async/groups_used"] + first["async/groups_without_signal"] + first["async/queue_depth"] >= 4
    else:
        assert all(row["llm_calls"] == 4 for row in rows)
    assert (tmp_path / "out" / "model" / "config.json").exists()
