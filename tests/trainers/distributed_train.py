"""One ``agl.train`` run of tests/trainers/test_distributed.py: ``accelerate launch ... distributed_train.py OUT``
runs it across processes, :func:`train` in one. The rollouts' replies come from a mock server (a deterministic
backend), so every run trains on the same batches; each rank saves its final weights (under FSDP: rank 0 its
unsharded copy, the others their shards), and which server/client modules it loaded, to ``OUT/rank<N>.pt``; then
the run resumed for a third step (``rank<N>-resumed.pt``) and a run on the Hugging Face backend
(``rank<N>-live.pt``). ``distributed_train.py OUT 0.9`` trains with momentum 0.9 (its buffers go through the
checkpoint)."""

from __future__ import annotations

import collections
import contextlib
import sys
import threading
from pathlib import Path
from typing import Any

import torch
from agentlightning.trainers.models import tiny_model
from train_agents import counted_reply_agent, reply_length_agent

import agentlightning as agl
from agentlightning.testing import MockLLMServer, MockReply, MockRequest

TASKS = [{"id": f"t{i}", "question": f"What is {i} + {i}?"} for i in range(3)]


class CountingBackend:
    """A :class:`~agentlightning.trainers.backends.base.Backend` over the mock server: the k-th reply to a prompt is
    ``"answer k"``. It leaves ``backend-started-rank<N>`` in ``marks`` when it starts. ``version``: of the weights
    it stands for (a resumed run's)."""

    def __init__(self, marks: Path, version: str = "v0") -> None:
        self.marks, self.sampling_overrides, self._version = marks, {}, version
        self._counts: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self._server = MockLLMServer(handler=self._reply, token_ids=True)

    def _reply(self, request: MockRequest) -> MockReply:
        with self._lock:
            self._counts[request.last_user_text] += 1
            return MockReply(content=f"answer {self._counts[request.last_user_text]}")

    @property
    def base_url(self) -> str:
        return self._server.base_url

    @property
    def model_name(self) -> str:
        return "mock-model"

    @property
    def model_version(self) -> str:
        return self._version

    def start(self) -> CountingBackend:
        from accelerate import PartialState

        (self.marks / f"backend-started-rank{PartialState().process_index}").touch()
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    @property
    def generates_during_update(self) -> bool:
        return False

    @property
    def last_logprob_gap(self) -> float | None:
        return None

    @contextlib.contextmanager
    def updating(self, new_version: str, policy: str | None = None) -> Any:
        yield
        self._version = new_version

    def served(self, policy: str | None) -> tuple[str, str]:
        return self.model_name, self._version


def train(out: Path, momentum: float = 0.0, **options: Any) -> Any:
    """The compared run: two steps of SGD (with ``momentum``) against the counting mock server (``options`` replace
    settings)."""
    model, tokenizer = tiny_model(seed=3)  # the same random weights on every rank
    settings = dict(
        backend=CountingBackend(out),
        output_dir=out / "run",
        tasks_per_step=1,
        group_size=5,
        max_steps=2,
        micro_batch_size=2,
        nworkers=1,
        learning_rate=0.5,
        save_model=False,
        progress=False,
        rollout_timeout=60,
        trainer_args={
            "optim": "sgd",
            "optim_args": f"momentum={momentum}",
            "vllm_importance_sampling_correction": False,
        },
    )
    return agl.train(counted_reply_agent, TASKS, model=model, tokenizer=tokenizer, **{**settings, **options})


def resumed(out: Path) -> dict[str, Any]:
    """The options that continue the run in ``out`` for a third step, saving the final model."""
    return {"max_steps": 3, "resume": True, "backend": CountingBackend(out, "v2"), "save_model": True}


def train_live(out: Path) -> Any:
    """A LoRA adapter trained on the Hugging Face backend (rank 0's live weights), the next step's rollouts sampled
    during the update."""
    model, tokenizer = tiny_model(seed=4)
    return agl.train(
        reply_length_agent,
        TASKS,
        model=model,
        tokenizer=tokenizer,
        output_dir=out / "live",
        use_server=False,
        nworkers=4,
        tasks_per_step=1,
        group_size=4,
        max_steps=2,
        max_staleness=1,
        micro_batch_size=2,
        lora={"r": 4, "lora_alpha": 8},
        learning_rate=0.05,
        save_model=False,
        progress=False,
        rollout_timeout=60,
    )


def _save(result: Any, path: Path) -> None:
    """The rank's model (under FSDP: rank 0's unsharded copy, the other ranks' own shards, named in ``sharded``;
    under ZeRO-3: rank 0's copy, the other ranks' models, whose parameters ZeRO-3 partitions named in
    ``partitioned``)."""
    from torch.distributed.tensor import DTensor

    loaded = sorted(name for name in sys.modules if name.startswith(("agentlightning.server", "agentlightning.client")))
    state = result.model.state_dict()
    torch.save(
        {
            "weights": {k: (v.to_local() if isinstance(v, DTensor) else v).detach().cpu() for k, v in state.items()},
            "sharded": sorted(k for k, v in state.items() if isinstance(v, DTensor)),
            "partitioned": sorted(
                name
                for name, param in result.model.named_parameters()  # by ZeRO-3
                if hasattr(param, "ds_tensor") and param.ds_tensor.numel() < param.ds_numel
            ),
            "steps": len(result.history),
            "version": result.model_version,
            "modules": loaded,
        },
        path,
    )


if __name__ == "__main__":
    from accelerate import PartialState

    out, momentum = Path(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    rank = train(out, momentum)  # initialises the process group (TRL's TrainingArguments)
    index = PartialState().process_index
    _save(rank, out / f"rank{index}.pt")
    _save(train(out, momentum, **resumed(out)), out / f"rank{index}-resumed.pt")
    _save(train_live(out), out / f"rank{index}-live.pt")
