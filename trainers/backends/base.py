"""The model backend behind the Lightning proxy: an OpenAI-compatible server that serves the policy being trained.

Two implement it: :class:`~agentlightning.trainers.backends.hf.server.HFBackendServer` (in-process, CPU or GPU,
serves the trainer's live weights) and :class:`~agentlightning.trainers.backends.vllm.server.VLLMBackend` (a vLLM
server, weights synced after each update). The training loop uses a backend like this::

    backend.start()
    backend.sampling_overrides = {"temperature": 1.0}  # forced on every rollout request (see below)
    ...  # rollouts call backend.base_url with backend.model_name
    with backend.updating("v1"):
        trainer.step()  # the weights change inside the block
    # from here on requests must use backend.model_name (it may change per version) and carry "v1"
    backend.stop()

With ``agl.train(max_staleness=K > 0)`` rollouts keep running through :meth:`Backend.updating`: a request is
answered by one set of weights (the HF backend pauses generation only for the optimizer step and reports the version
with each response; vLLM's ``disk`` sync waits for running requests, ``lora`` sync keeps the previous adapter).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Backend(Protocol):
    """An OpenAI-compatible endpoint serving the policy, kept equal to the trainer's weights.

    This is everything the training loop uses. ``agl.train(backend=<a Backend>)`` uses the object as it is given
    (it is never written to): it serves what it was built to serve.
    """

    sampling_overrides: dict[str, Any]
    """Request fields forced on every rollout request (e.g. ``{"temperature": 1.0}``), whatever the agent sends,
    so the sampler and the trainer agree. The HF backend applies them itself; for vLLM the proxy must."""

    @property
    def base_url(self) -> str:
        """OpenAI base URL, ending in ``/v1``."""
        ...

    @property
    def model_name(self) -> str:
        """The ``model`` requests must name now; read it again after :meth:`updating` (LoRA sync renames it)."""
        ...

    @property
    def model_version(self) -> str:
        """Version of the weights served now."""
        ...

    @property
    def generates_during_update(self) -> bool:
        """Whether the backend samples from the trainer's own weights, in the mode they are in, so that rollouts can
        keep generating through an update's forward and backward passes (then :meth:`updating` is entered around
        the optimizer step only). False for a backend that serves a copy (vLLM) or switches the weights' mode."""
        ...

    @property
    def last_logprob_gap(self) -> float | None:
        """The largest sampler/trainer log-probability difference measured after the last weight sync, or None when
        the backend does not measure one (the HF backend serves the trained weights themselves)."""
        ...

    def start(self) -> Backend:
        """Start serving (or connect); returns ``self`` once requests are answered."""
        ...

    def stop(self) -> None:
        """Stop what :meth:`start` started (idempotent)."""
        ...

    def updating(self, new_version: str, policy: str | None = None) -> AbstractContextManager[None]:
        """Context for one weight update: the block changes the trainer's weights; on exit the backend serves
        them as ``new_version`` (with ``agl.train(policies=...)``: the adapter of policy ``policy``)."""
        ...

    def served(self, policy: str | None) -> tuple[str, str]:
        """(model name, version) that serve ``policy``'s adapter now (None: the base model); the proxy routes each
        role's calls there with ``agl.train(policies=...)``."""
        ...
