"""One configuration surface: ``TrainConfig``'s fields are the ``agl train`` and ``agl server --model`` flags (same
names, same defaults, shown in ``--help``), the ``--set`` keys, the config file's keys and ``agl.train``'s typed
keywords."""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
import typing
from dataclasses import MISSING, fields
from pathlib import Path

import pytest
from agentlightning.trainers import train
from agentlightning.trainers._arguments import NOT_FLAGS, add_train_arguments, options_from_args
from agentlightning.trainers.config import TrainConfig, TrainOptions

import agentlightning as agl
from agentlightning._cli import add_server_arguments

AGL = [sys.executable, "-m", "agentlightning._cli"]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}


def _help(*command: str) -> str:
    done = subprocess.run([*AGL, *command, "--help"], capture_output=True, text=True, env=ENV, timeout=60)
    assert done.returncode == 0, done.stderr
    return " ".join(done.stdout.split())  # argparse wraps lines; compare on one line


def _defaults() -> dict[str, object]:
    config = TrainConfig()
    return {item.name: getattr(config, item.name) for item in fields(TrainConfig)}


@pytest.mark.parametrize("command", [("train",), ("server",)])
def test_help_lists_every_training_flag_with_the_config_default(command: tuple[str, ...]) -> None:
    text = _help(*command).split("training options (TrainConfig fields", 1)[1]  # after the usage line
    skipped = {"model", "use_server", "nworkers", "workers", "rollout_timeout"} if command == ("server",) else set()
    for name, value in _defaults().items():
        if name in NOT_FLAGS or name in skipped:
            continue
        flag = "--" + name.replace("_", "-")
        shown = "none" if name == "report_to" else str(value)
        match = re.search(re.escape(flag) + r"[ ,].*?\(default: ([^)]*)\)", text)
        assert match, f"{flag} missing from agl {' '.join(command)} --help"
        assert match.group(1) == shown, (flag, match.group(1), shown)
    assert "--max-steps MAX_STEPS Training steps (optimizer updates) of the run. (default: 10)" in text
    assert "--group-size GROUP_SIZE Rollouts per task (the GRPO group). (default: 4)" in text
    assert "--learning-rate LEARNING_RATE The optimizer's (AdamW) learning rate. (default: 1e-05)" in text


def test_server_help_shows_its_own_defaults_too() -> None:
    text = _help("server")
    assert (
        "--port PORT port to listen on (0: a free one) (default: 4747)" in text
        and "--timeout TIMEOUT default seconds per rollout (default: 600.0)" in text
    )


def test_config_file_then_flags_then_set(tmp_path: Path) -> None:
    import argparse

    (tmp_path / "train.json").write_text(json.dumps({"group_size": 6, "max_steps": 7, "lora": True}))
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    args = parser.parse_args(
        ["--config", str(tmp_path / "train.json"), "--max-steps", "3", "--set", "max_steps=5", "--no-progress"]
        + ["--report-to", "none", "--resume", "--max-completion-length", "none", "--roles", "writer", "checker"]
    )
    config = TrainConfig.from_options(None, options_from_args(args))
    assert (config.group_size, config.max_steps, config.lora, config.progress) == (6, 5, True, False)
    assert (config.report_to, config.resume, config.max_completion_length) == ((), True, None)
    assert list(config.roles or ()) == ["writer", "checker"]
    assert TrainConfig.from_options(None, options_from_args(parser.parse_args([]))) == TrainConfig()


def test_server_and_train_take_the_same_options_and_defaults(tmp_path: Path) -> None:
    import argparse

    from agentlightning.trainers import serve

    parser = argparse.ArgumentParser()
    add_server_arguments(parser)
    args = parser.parse_args(["--model", "smollm2", "--group-size", "1"])
    with pytest.raises(ValueError, match="group_size=1"):  # refused before the server starts
        serve.serve_training(None, args)  # type: ignore[arg-type]
    config = serve.training_config(parser.parse_args(["--model", "smollm2"]))
    expected = TrainConfig(model="smollm2", nworkers=0, rollout_timeout=600.0)
    assert (config.group_size, config.tasks_per_step, config.learning_rate, config.max_steps) == (4, 4, 1e-5, 10)
    assert config == expected


def test_agl_server_model_with_a_bad_option_exits_2_at_once(tmp_path: Path) -> None:
    done = subprocess.run(
        [*AGL, "server", "--model", "smollm2", "--port", "0", "--store", str(tmp_path / "s.db"), "--group-size", "1"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=60,
    )
    assert done.returncode == 2
    assert "group_size=1" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "s.db").exists()


def test_train_keywords_are_the_config_fields() -> None:
    hints = typing.get_type_hints(TrainOptions)
    assert set(hints) | {"roles"} == {item.name for item in fields(TrainConfig)}
    config_hints = typing.get_type_hints(TrainConfig)
    assert {name: config_hints[name] for name in hints} == hints
    options = inspect.signature(train).parameters["options"]  # what an editor completes agl.train's keywords from
    assert options.kind is inspect.Parameter.VAR_KEYWORD and options.annotation == "Unpack[TrainOptions]"
    assert agl.TrainConfig is TrainConfig and "TrainConfig" in agl.__all__
    assert all(item.default is not MISSING or item.default_factory is not MISSING for item in fields(TrainConfig))


def test_unknown_keyword_names_the_fields() -> None:
    with pytest.raises(TypeError, match="unknown option\\(s\\) \\['max_step'\\]"):
        TrainConfig.from_options(None, {"max_step": 3})
