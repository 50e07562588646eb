"""``agl.train`` across processes: two ranks under ``accelerate launch`` make the single-process update.

The launch is ``accelerate launch --multi_gpu --num_processes 2`` on this CPU machine: torchrun starts two processes
and TRL's ``TrainingArguments`` (``use_cpu``) join them over gloo. (Under accelerate 1.15, ``accelerate launch --cpu
--num_processes 2`` starts a single process: its simple launcher spreads CPU ranks only through ``mpirun``.)
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from agentlightning.trainers.learner._distributed import shard
from agentlightning.trainers.learner.batch import pack
from agentlightning.trainers.models import tiny_model

from agentlightning.types import Transition

HERE = Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _launch_and_compare(two: Path, one: Path, launch_args: list[str], momentum: float) -> tuple[Any, Any, dict]:
    """Launch distributed_train.py on 2 ranks into ``two`` while this process makes the same two runs (2 steps, then
    resumed for a third) into ``one``; return those runs' results and what each rank saved, by (rank, tag)."""
    import distributed_train

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        *launch_args,
        "--main_process_port",
        str(_free_port()),
        str(HERE / "distributed_train.py"),
        str(two),
        str(momentum),
    ]
    launch = subprocess.Popen(command, cwd=HERE, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        reference = distributed_train.train(one, momentum)  # the same runs in this one process, meanwhile
        reference_resumed = distributed_train.train(one, momentum, **distributed_train.resumed(one))
        output, _ = launch.communicate(timeout=300)
    finally:
        if launch.poll() is None:
            launch.kill()
            launch.communicate()
    assert launch.returncode == 0, output[-4000:]
    saved = {
        (rank, tag): torch.load(two / f"rank{rank}{tag}.pt", weights_only=True)
        for rank in (0, 1)
        for tag in ("", "-resumed", "-live")
    }
    return reference, reference_resumed, saved


def test_two_ranks_train_like_one_process_and_only_rank_0_serves(tmp_path):
    pytest.importorskip("accelerate")

    two, one = tmp_path / "two", tmp_path / "one"
    two.mkdir()
    one.mkdir()
    reference, reference_resumed, saved = _launch_and_compare(
        two,
        one,
        [
            "--multi_gpu",
            "--num_processes",
            "2",
            "--num_machines",
            "1",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
        ],
        0.0,
    )
    rank0 = saved[0, ""]

    # Every rank holds the same weights after the updates, equal (up to float rounding) to one process's; so after
    # a resumed third step (rank 1 loads the checkpoint rank 0 chose).
    initial = tiny_model(seed=3)[0].state_dict()
    for tag, result, steps in (("", reference, 2), ("-resumed", reference_resumed, 3)):
        single = {name: value.detach() for name, value in result.model.state_dict().items()}
        assert max(float((single[name] - initial[name]).abs().max()) for name in single) > 1e-2  # it moved
        for name, value in saved[0, tag]["weights"].items():
            assert torch.equal(value, saved[1, tag]["weights"][name]), (tag, name)
            gap = float((value - single[name]).abs().max())
            assert torch.allclose(value, single[name], rtol=0, atol=1e-6), (tag, name, gap)
        assert saved[0, tag]["steps"] == saved[1, tag]["steps"] == len(result.history) == steps
        assert saved[0, tag]["version"] == saved[1, tag]["version"] == result.model_version == f"v{steps}"
    third = {name: value - rank0["weights"][name] for name, value in saved[0, "-resumed"]["weights"].items()}
    assert max(float(delta.abs().max()) for delta in third.values()) > 1e-3  # the third step trained

    # The Hugging Face backend on rank 0 sampled from rank 0's live weights, which DDP kept equal to rank 1's (a LoRA
    # adapter, trained).
    live0, live1 = saved[0, "-live"], saved[1, "-live"]
    assert live0["version"] == live1["version"] == "v2"
    assert all(torch.equal(value, live1["weights"][name]) for name, value in live0["weights"].items())
    adapter = [value for name, value in live0["weights"].items() if "lora_B" in name]
    assert adapter and max(float(value.abs().max()) for value in adapter) > 0  # lora_B starts at zero
    live = [json.loads(line) for line in (two / "live" / "metrics.jsonl").read_text().splitlines()]
    assert [row["model_version_after"] for row in live] == ["v1", "v2"] and all(row["transitions"] for row in live)

    # Only rank 0 started the backend, the Lightning Server and the workers, and wrote the run's files.
    assert sorted(path.name for path in two.glob("backend-started-*")) == ["backend-started-rank0"]
    assert "agentlightning.server" in rank0["modules"] and "agentlightning.client._pool" in rank0["modules"]
    assert saved[1, ""]["modules"] == saved[1, "-live"]["modules"] == []
    rows = [json.loads(line) for line in (two / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3]
    assert all(row["train/rows"] == 5 and row["train/micro_batches"] == 2 for row in rows)  # 3 rows a rank
    with sqlite3.connect(two / "run" / "store.db") as store:
        assert store.execute("SELECT status, COUNT(*) FROM rollouts GROUP BY status").fetchall() == [("succeeded", 15)]
    assert sorted(path.name for path in (two / "run" / "checkpoints").iterdir()) == ["step-2", "step-3"]


def test_fsdp2_ranks_shard_the_model_train_like_one_process_and_rank_0_serves_a_gathered_copy(tmp_path):
    """FSDP2 from an accelerate config file (tests/trainers/fsdp2.yaml), SGD with momentum, whose buffers the
    checkpoint gathers from the shards and the resumed run shards again."""
    pytest.importorskip("accelerate")
    from transformers import AutoModelForCausalLM

    two, one = tmp_path / "two", tmp_path / "one"
    two.mkdir()
    one.mkdir()
    reference, reference_resumed, saved = _launch_and_compare(
        two, one, ["--config_file", str(HERE / "fsdp2.yaml")], 0.9
    )

    # Rank 1 holds only its shard of each parameter (FSDP2 splits dim 0), and it is the matching slice of the
    # unsharded copy rank 0 serves; that copy equals (up to float rounding) one process's weights, after two updates
    # and after a third resumed from the checkpoint (whole weights and momentum, sharded again on load).
    for tag, result, steps in (("", reference, 2), ("-resumed", reference_resumed, 3)):
        single = {name: value.detach() for name, value in result.model.state_dict().items()}
        copy, shards = saved[0, tag]["weights"], saved[1, tag]
        assert saved[0, tag]["sharded"] == [] and set(shards["sharded"]) == set(single) == set(copy)
        for name, value in copy.items():
            gap = float((value - single[name]).abs().max())
            assert torch.allclose(value, single[name], rtol=0, atol=1e-6), (tag, name, gap)
            local = shards["weights"][name]
            assert local.numel() < value.numel() and torch.equal(local, value.chunk(2)[1]), (tag, name)
        assert saved[0, tag]["steps"] == shards["steps"] == len(result.history) == steps
        assert saved[0, tag]["version"] == shards["version"] == result.model_version == f"v{steps}"
    third = {name: value - saved[0, ""]["weights"][name] for name, value in saved[0, "-resumed"]["weights"].items()}
    assert max(float(delta.abs().max()) for delta in third.values()) > 1e-3  # the third step trained
    optimizers = [
        torch.load(run / "run" / "checkpoints" / "step-3" / "optimizer.pt", weights_only=True) for run in (two, one)
    ]
    assert optimizers[0]["state"].keys() == optimizers[1]["state"].keys() and optimizers[0]["state"]
    for index, state in optimizers[1]["state"].items():
        assert torch.allclose(
            optimizers[0]["state"][index]["momentum_buffer"], state["momentum_buffer"], rtol=0, atol=1e-6
        ), index
    model = AutoModelForCausalLM.from_pretrained(two / "run" / "model")  # save_model: the gathered weights
    final = saved[0, "-resumed"]["weights"]
    assert all(torch.equal(value, final[name]) for name, value in model.state_dict().items())

    # The Hugging Face backend on rank 0 sampled from its copy, a LoRA adapter gathered after each update: equal to
    # rank 1's shards of the adapter, and trained.
    live0, live1 = saved[0, "-live"], saved[1, "-live"]
    assert live0["version"] == live1["version"] == "v2"
    adapter = [name for name in live0["weights"] if "lora_B" in name]
    assert adapter and set(adapter) <= set(live1["sharded"])
    assert all(torch.equal(live1["weights"][name], live0["weights"][name].chunk(2)[1]) for name in live1["sharded"])
    assert max(float(live0["weights"][name].abs().max()) for name in adapter) > 0  # lora_B starts at zero
    live = [json.loads(line) for line in (two / "live" / "metrics.jsonl").read_text().splitlines()]
    assert [row["model_version_after"] for row in live] == ["v1", "v2"] and all(row["transitions"] for row in live)

    # Only rank 0 started the backend, the Lightning Server and the workers.
    assert sorted(path.name for path in two.glob("backend-started-*")) == ["backend-started-rank0"]
    assert "agentlightning.server" in saved[0, ""]["modules"] and saved[1, ""]["modules"] == []
    assert sorted(path.name for path in (two / "run" / "checkpoints").iterdir()) == ["step-2", "step-3"]


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_zero_ranks_train_like_one_process_and_resume_from_the_engine_state(tmp_path, stage):
    """DeepSpeed from an accelerate config file (tests/trainers/deepspeed.yaml, ZeRO ``stage``) on CPU ranks: the
    engine steps inside the last micro-batch's backward; its checkpoint (momentum buffers in ZeRO's partitions)
    resumes the run; under ZeRO-3 rank 0 serves a gathered copy."""
    import deepspeed  # noqa: F401  (the [deepspeed] extra, part of [all])
    import distributed_train
    from transformers import AutoModelForCausalLM

    two, one = tmp_path / "two", tmp_path / "one"
    two.mkdir()
    one.mkdir()
    reference, reference_resumed, saved = _launch_and_compare(
        two, one, ["--config_file", str(HERE / "deepspeed.yaml"), "--zero_stage", str(stage)], 0.9
    )

    # Rank 0's weights equal one process's after two updates and after a third resumed from the checkpoint (SGD
    # with momentum: a resume that lost the momentum buffers would differ). Under ZeRO-2 every rank holds them
    # whole; under ZeRO-3 rank 1 holds only placeholders (its partition lives in the engine) and rank 0 its copy.
    for tag, result, steps in (("", reference, 2), ("-resumed", reference_resumed, 3)):
        single = {name: value.detach() for name, value in result.model.state_dict().items()}
        weights, other = saved[0, tag]["weights"], saved[1, tag]["weights"]
        assert set(weights) == set(single) == set(other)
        for name, value in weights.items():
            gap = float((value - single[name]).abs().max())
            assert torch.allclose(value, single[name], rtol=0, atol=1e-6), (tag, name, gap)
            if stage == 2:
                assert torch.equal(other[name], value), (tag, name)
        if stage == 3:
            assert saved[0, tag]["partitioned"] == [] and saved[1, tag]["partitioned"], saved[1, tag]["partitioned"]
        assert saved[0, tag]["steps"] == saved[1, tag]["steps"] == len(result.history) == steps
        assert saved[0, tag]["version"] == saved[1, tag]["version"] == result.model_version == f"v{steps}"
    third = {name: value - saved[0, ""]["weights"][name] for name, value in saved[0, "-resumed"]["weights"].items()}
    assert max(float(delta.abs().max()) for delta in third.values()) > 1e-3  # the third step trained
    checkpoint = two / "run" / "checkpoints" / "step-3"
    assert not (checkpoint / "optimizer.pt").exists()
    assert sorted(path.name for path in (checkpoint / "deepspeed" / "engine").glob("*optim_states.pt")) == [
        "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "zero_pp_rank_1_mp_rank_00_optim_states.pt",
    ]
    model = AutoModelForCausalLM.from_pretrained(two / "run" / "model")  # save_model: the whole weights
    final = saved[0, "-resumed"]["weights"]
    assert all(torch.equal(value, final[name]) for name, value in model.state_dict().items())
    # A checkpoint of a DeepSpeed run does not resume without DeepSpeed (its optimizer state is partitioned).
    with pytest.raises(ValueError, match="made under DeepSpeed"):
        distributed_train.train(two, 0.9, **{**distributed_train.resumed(two), "max_steps": 4})

    # The Hugging Face backend on rank 0 sampled from the trained weights (ZeRO-2: its live model, equal to rank
    # 1's; ZeRO-3: its copy, gathered after each update): a LoRA adapter, trained.
    live0, live1 = saved[0, "-live"], saved[1, "-live"]
    assert live0["version"] == live1["version"] == "v2"
    adapter = [name for name in live0["weights"] if "lora_B" in name]
    assert adapter and max(float(live0["weights"][name].abs().max()) for name in adapter) > 0  # lora_B starts at 0
    if stage == 2:
        assert all(torch.equal(value, live1["weights"][name]) for name, value in live0["weights"].items())
    live = [json.loads(line) for line in (two / "live" / "metrics.jsonl").read_text().splitlines()]
    assert [row["model_version_after"] for row in live] == ["v1", "v2"] and all(row["transitions"] for row in live)

    assert sorted(path.name for path in two.glob("backend-started-*")) == ["backend-started-rank0"]
    assert "agentlightning.server" in saved[0, ""]["modules"] and saved[1, ""]["modules"] == []


def test_shards_split_the_rows_and_pad_short_ranks_with_rows_that_add_nothing():
    rows = [
        Transition(
            rollout_id=f"r{i}",
            group_id="g",
            index=0,
            prompt_token_ids=[5, 6 + i],
            completion_token_ids=[7] * (i + 1),
            advantage=float(i) - 2,
            weight=0.5 + i,
        )
        for i in range(5)
    ]
    batch = pack(rows, pad_token_id=0)
    parts = [shard(batch, rank, 3) for rank in range(3)]
    assert [len(part) for part, _ in parts] == [2, 2, 2]
    totals = parts[0][1]
    assert (totals.rows, totals.tokens, totals.processes) == (5, 15.0, 3)
    assert totals.mean_weight == pytest.approx(2.5)
    real = [
        rollout
        for part, _ in parts
        for rollout, mask in zip(part.rollout_ids, part.completion_mask.sum(1), strict=True)
        if mask > 0
    ]
    assert real == batch.rollout_ids  # every row once, in order
    padding, _ = parts[2]  # rows 4 and a padding copy of it
    assert padding.rollout_ids == ["r4", "r4"] and padding.completion_mask[1].sum() == 0
    assert padding.advantages[1] == 0 and padding.weights[1] == pytest.approx(2.5)
    assert torch.equal(batch.completion_mask[4], padding.completion_mask[0])  # the original is untouched
    assert shard(batch, 0, 1)[0] is batch
