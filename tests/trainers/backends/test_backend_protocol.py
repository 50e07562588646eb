"""The ``Backend`` protocol is everything the training loop uses, and a backend given to ``agl.train`` is used as
given."""

from __future__ import annotations

from typing import Any

from agentlightning.trainers.backends._make import make_backend
from agentlightning.trainers.backends.base import Backend
from agentlightning.trainers.backends.hf.server import HFBackendServer
from agentlightning.trainers.config import TrainConfig
from agentlightning.trainers.models import tiny_model
from train_agents import reply_length_agent

import agentlightning as agl

MEMBERS = frozenset(name for name in vars(Backend) if not name.startswith("_")) | set(Backend.__annotations__)


class ProtocolOnly:
    """Exposes of the backend it wraps exactly the members of the ``Backend`` protocol: the loop touching anything
    else fails with the name it used."""

    def __init__(self, inner: Any) -> None:
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "used", set())

    def __getattr__(self, name: str) -> Any:
        if name not in MEMBERS:
            raise AttributeError(f"the training loop used backend.{name}, which the Backend protocol does not list")
        self.used.add(name)
        return getattr(self._inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in MEMBERS:
            raise AttributeError(f"the training loop set backend.{name}, which the Backend protocol does not list")
        self.used.add(name)
        setattr(self._inner, name, value)

    def start(self) -> ProtocolOnly:
        self.used.add("start")
        self._inner.start()
        return self


def test_the_protocol_lists_what_the_loop_calls_and_the_given_backend_is_not_written_to(tmp_path):
    model, tokenizer = tiny_model(seed=1)
    inner = HFBackendServer(model, tokenizer, always_logprobs=True, default_max_tokens=8)
    before = dict(vars(inner))
    backend = ProtocolOnly(inner)
    assert isinstance(backend, Backend)
    tasks = [{"id": f"t{i}", "question": f"What is {i} + {i}?"} for i in range(2)]

    result = agl.train(
        reply_length_agent,
        tasks,
        model=model,
        tokenizer=tokenizer,
        backend=backend,
        group_size=2,
        tasks_per_step=2,
        max_steps=2,
        learning_rate=1e-2,
        micro_batch_size=2,
        max_completion_length=8,
        output_dir=tmp_path / "run",
        nworkers=2,
        progress=False,
        save_model=False,
        val_dataset=tasks[:1],
        val_every=0,
    )

    assert result.model_version == "v2" and [row["step"] for row in result.history] == [0, 1, 2]
    assert {
        "start",
        "stop",
        "updating",
        "base_url",
        "model_name",
        "model_version",
        "sampling_overrides",
    } <= backend.used
    changed = {name for name, value in vars(inner).items() if before.get(name, object()) is not value}
    # Its own state moves as it serves (the HTTP server, the port it took); the loop sets the sampling overrides.
    assert changed <= {"_http", "_port", "sampling_overrides"}, changed


def test_make_backend_returns_a_given_backend_untouched():
    model, tokenizer = tiny_model(seed=1)
    given = HFBackendServer(model, tokenizer)
    before = dict(vars(given))
    made = make_backend(TrainConfig(backend=given, report_to="none"), object(), tokenizer, "other", "v7", None)
    assert made is given and vars(given) == before
