"""One TrainConfig: the vLLM options group, config files and --set, `agl train`, report_to, and the proxy forcing
the training temperature (what vLLM cannot do itself)."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest
from agentlightning.trainers.config import TrainConfig, VLLMOptions, load_config

from agentlightning._cli import main
from agentlightning.server import LightningServer
from agentlightning.testing import MockLLMServer


def test_vllm_options_group_and_backend_choice() -> None:
    config = TrainConfig(backend="vllm", vllm={"url": "http://127.0.0.1:8000", "sync": "disk"}, report_to="none")
    assert config.vllm == VLLMOptions(url="http://127.0.0.1:8000", sync="disk") and config.report_to == ()
    assert TrainConfig(report_to="tensorboard").report_to == ("tensorboard",)
    with pytest.raises(TypeError, match="unknown \\['gpu'\\]"):
        TrainConfig(vllm={"gpu": 1})
    with pytest.raises(ValueError, match="'hf', 'vllm' or a Backend"):
        TrainConfig(backend="sglang")
    with pytest.raises(ValueError, match="unknown \\['comet'\\]"):
        TrainConfig(report_to=["comet"])
    with pytest.raises(ValueError, match="use_server=False\\) works with backend='hf' only"):
        TrainConfig(backend="vllm", use_server=False)


def test_config_file_then_set_pairs(tmp_path: Path) -> None:
    (tmp_path / "train.json").write_text(json.dumps({"group_size": 4, "lora": True, "vllm": {"sync": "lora"}}))
    config = load_config(
        tmp_path / "train.json",
        ["group_size=8", "model=smollm2", "vllm.dtype=float32", 'report_to=["tensorboard"]', "learning_rate=1e-4"],
    )
    assert (config.group_size, config.model, config.lora, config.learning_rate) == (8, "smollm2", True, 1e-4)
    assert (config.vllm.sync, config.vllm.dtype) == ("lora", "float32") and config.report_to == ("tensorboard",)
    pytest.importorskip("yaml")
    (tmp_path / "train.yaml").write_text("backend: vllm\nvllm:\n  url: http://h:8000\nmax_steps: 3\n")
    config = load_config(tmp_path / "train.yaml", ["vllm.sync=disk"])
    assert (config.backend, config.max_steps, config.vllm.url, config.vllm.sync) == ("vllm", 3, "http://h:8000", "disk")
    with pytest.raises(TypeError, match="unknown option"):
        load_config(None, ["group_sise=8"])
    with pytest.raises(ValueError, match="FIELD=VALUE"):
        load_config(None, ["group_size"])


def test_proxy_forces_the_sampling_overrides(tmp_path: Path) -> None:
    with MockLLMServer() as mock, LightningServer(tmp_path / "store.db") as server:
        server.set_upstream(mock.base_url, "m", "v1", sampling_overrides={"temperature": 1.0})
        server.set_upstream(mock.base_url, "m", "v2")  # the overrides stay until replaced
        [rid] = server.enqueue([{"q": "x"}])
        assert server.store.dequeue("w", 30.0).rollout_id == rid
        client = openai.OpenAI(base_url=f"{server.url}/rollouts/{rid}/v1", api_key="x", max_retries=0)
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], temperature=0.0)
        assert mock.requests[-1].body["temperature"] == 1.0
        server.set_upstream(mock.base_url, "m", "v3", sampling_overrides={})
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], temperature=0.0)
        assert mock.requests[-1].body["temperature"] == 0.0


def test_proxy_caps_the_answer_length_at_max_completion_length(tmp_path: Path) -> None:
    """TrainConfig.max_completion_length is the most tokens a rollout's call generates: an agent asking for more
    (or not saying) gets that many, one asking for fewer keeps its own limit, whichever field it uses."""
    with MockLLMServer() as mock, LightningServer(tmp_path / "store.db") as server:
        server.set_upstream(mock.base_url, "m", "v1", max_tokens_limit=16)
        [rid] = server.enqueue([{"q": "x"}])
        assert server.store.dequeue("w", 30.0).rollout_id == rid
        client = openai.OpenAI(base_url=f"{server.url}/rollouts/{rid}/v1", api_key="x", max_retries=0)
        messages = [{"role": "user", "content": "hi"}]
        client.chat.completions.create(model="m", messages=messages, max_tokens=512)
        client.chat.completions.create(model="m", messages=messages, max_completion_tokens=8)
        client.chat.completions.create(model="m", messages=messages)
        client.completions.create(model="m", prompt="hi", max_tokens=100)
        client.responses.create(model="m", input="hi", max_output_tokens=64)
        sent = [request.body for request in mock.requests]
        assert [body.get("max_completion_tokens") for body in sent[:3]] == [16, 8, 16]
        assert not any("max_tokens" in body for body in sent[:3])
        assert sent[3]["max_tokens"] == 16 and sent[4]["max_output_tokens"] == 16
        server.set_upstream(mock.base_url, "m", "v2")  # the cap stays until replaced
        client.chat.completions.create(model="m", messages=messages, max_tokens=512)
        assert mock.requests[-1].body["max_completion_tokens"] == 16


def _tiny_model_dir(path: Path) -> Path:
    from agentlightning.trainers.models import tiny_model

    model, tokenizer = tiny_model(seed=3)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.slow
def test_agl_train_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("trl")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"t{i}", "question": f"{i} + {i}?"}) + "\n" for i in range(3)))
    (tmp_path / "train.json").write_text(
        json.dumps(
            {
                "model": str(_tiny_model_dir(tmp_path / "model")),
                "group_size": 2,
                "tasks_per_step": 2,
                "max_steps": 1,
                "micro_batch_size": 2,
                "max_completion_length": 8,  # what the agent asks: a shorter cap would tie its rewards
                "use_server": False,
                "progress": False,
            }
        )
    )
    code = main(
        [
            "train",
            "train_agents:reply_text_agent",  # echo_length_agent's len % 3 tied both groups in CI
            "--dataset",
            str(tasks),
            "--val-dataset",
            str(tasks),
            "--config",
            str(tmp_path / "train.json"),
            "--set",
            f"output_dir={tmp_path / 'run'}",
            "--set",
            "save_model=false",
            "--set",
            "learning_rate=1e-2",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "trained 1 steps" in out and "held-out reward" in out
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [0, 1]


@pytest.mark.slow
def test_report_to_tensorboard_writes_event_files(tmp_path: Path) -> None:
    pytest.importorskip(
        "tensorboard", reason="the [tensorboard] extra (tensorboard==2.21.0), which cannot share a venv with [autogen]"
    )
    from agentlightning.trainers.models import tiny_model
    from train_agents import echo_length_agent

    import agentlightning as agl

    model, tokenizer = tiny_model(seed=4)
    tasks = [{"id": f"t{i}", "question": f"{i} + {i}?"} for i in range(2)]
    agl.train(
        echo_length_agent,
        tasks,
        model=model,
        tokenizer=tokenizer,
        group_size=2,
        tasks_per_step=2,
        max_steps=1,
        micro_batch_size=2,
        max_completion_length=6,
        use_server=False,
        progress=False,
        save_model=False,
        output_dir=tmp_path / "run",
        report_to=["tensorboard"],
    )
    events = list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(events[0].parent))
    accumulator.Reload()
    assert "reward" in accumulator.Tags()["scalars"]
