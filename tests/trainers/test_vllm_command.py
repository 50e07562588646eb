"""VLLMBackend without a vLLM server: the command line it starts vLLM with, and how it refuses a server that is not
there or not ours (real loopback servers and closed ports; nothing here starts vLLM)."""

from __future__ import annotations

import socket
import sys
import time

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

from agentlightning.trainers.backends._make import make_backend  # noqa: E402
from agentlightning.trainers.backends.vllm.server import VLLMBackend, VLLMUnavailable, served_lora_rank  # noqa: E402
from agentlightning.trainers.config import TrainConfig, VLLMOptions  # noqa: E402
from agentlightning.trainers.models import tiny_model  # noqa: E402
from agentlightning.trainers.policies import PolicyMap  # noqa: E402

from agentlightning.testing import MockLLMServer  # noqa: E402


def _flag(command: list[str], name: str) -> str | None:
    return command[command.index(name) + 1] if name in command else None


def _lora(model, rank: int, **fields):
    config = peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj"], **fields)
    return peft.get_peft_model(model, config)


def test_max_lora_rank_is_the_trained_adapters_rounded_up(tmp_path) -> None:
    model, _ = tiny_model()
    policy = _lora(model, 16)
    command = VLLMBackend(tmp_path, policy=policy, sync="lora").command()
    assert (_flag(command, "--max-lora-rank"), _flag(command, "--max-loras")) == ("16", "1")
    assert served_lora_rank(_lora(tiny_model()[0], 12)) == 16  # vLLM accepts 1, 8, 16, 32, 64, ...
    assert served_lora_rank(_lora(tiny_model()[0], 4)) == 8
    assert served_lora_rank(_lora(tiny_model()[0], 8, rank_pattern={"v_proj": 40})) == 64
    with pytest.raises(ValueError, match="LoRA rank 600 is above vLLM's largest"):
        served_lora_rank(_lora(tiny_model()[0], 600))
    explicit = VLLMBackend(tmp_path, policy=policy, sync="lora", max_lora_rank=64).command()
    assert _flag(explicit, "--max-lora-rank") == "64"  # an explicit value wins
    disk = VLLMBackend(tmp_path, policy=model, sync="disk").command()
    assert "--enable-lora" not in disk and "--max-lora-rank" not in disk


def test_the_run_config_decides_rank_and_adapter_count(tmp_path) -> None:
    """Through make_backend, as agl.train builds it: rank from the policy, --max-loras from policies x kept."""
    model, tokenizer = tiny_model()
    policy = _lora(model, 8)
    policy.add_adapter("judge", peft.LoraConfig(r=32, target_modules=["q_proj"]))
    policies = PolicyMap.parse({"solver": True, "judge": True})
    config = TrainConfig(backend="vllm", lora=True, policies={"solver": True, "judge": True}, max_staleness=1)
    backend = make_backend(config, policy, None, "policy", "v0", tmp_path, policies)
    command = backend.command()
    assert (_flag(command, "--max-lora-rank"), _flag(command, "--max-loras")) == ("32", "4")
    single = make_backend(TrainConfig(backend="vllm", lora=True), _lora(tiny_model()[0], 16), None, "p", "v0", tmp_path)
    assert (_flag(single.command(), "--max-lora-rank"), _flag(single.command(), "--max-loras")) == ("16", "1")
    assert VLLMOptions().max_lora_rank is None
    with pytest.raises(ValueError, match="check_logprobs_every=0"):
        VLLMOptions(check_logprobs_every=0)
    del tokenizer


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_url_with_nothing_listening_fails_in_seconds() -> None:
    backend = VLLMBackend(url=f"http://127.0.0.1:{_closed_port()}", startup_timeout=600)
    started = time.monotonic()
    with pytest.raises(VLLMUnavailable, match="nothing is listening there"):
        backend.start()
    assert time.monotonic() - started < 15


def test_another_openai_server_is_not_taken_for_vllm(tmp_path) -> None:
    with MockLLMServer(models=["policy"]) as other:
        started = time.monotonic()
        with pytest.raises(VLLMUnavailable, match=r"not a vLLM server \(no /version\)"):
            VLLMBackend(url=other.url).start()
        assert time.monotonic() - started < 15
        # Asked to start vLLM on the port the other server holds: refused before anything is started.
        with pytest.raises(VLLMUnavailable, match=f"port={other.port}.*is taken"):
            VLLMBackend(tmp_path, port=other.port, python=sys.executable).start()


IMPOSTOR = """import sys, time
from agentlightning.testing import MockLLMServer

port = int(sys.argv[sys.argv.index("--port") + 1])
MockLLMServer(models=["policy"], port=port).start()
time.sleep(120)
"""


def test_a_server_on_our_port_that_is_not_our_vllm_is_not_trusted(tmp_path) -> None:
    """What answers on the port must serve our model directory under our name, not merely answer /v1/models."""
    script = tmp_path / "impostor.py"
    script.write_text(IMPOSTOR)
    python = tmp_path / "python"  # a "python" whose `-m vllm...` starts an OpenAI-compatible mock instead
    python.write_text(f'#!/bin/sh\nexec {sys.executable} {script} "$@"\n')
    python.chmod(0o755)
    backend = VLLMBackend(tmp_path, python=str(python), startup_timeout=8)
    with pytest.raises(TimeoutError, match=r"answered by another server \(models \['policy'\]\)"):
        backend.start()
    with socket.socket() as probe:  # start() failing stopped what it started: the port is free again
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", int(backend.url.rsplit(":", 1)[1])))
