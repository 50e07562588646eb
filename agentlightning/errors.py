"""Every error Agent Lightning raises on purpose, in one tree under :class:`AgentLightningError`.

``except agl.errors.AgentLightningError`` catches all of them; each also keeps the builtin base it always had
(a ``ValueError`` subclass is still caught by ``except ValueError``)::

    AgentLightningError
    ├── ConfigError (ValueError)            a TrainConfig / agl.train / agl train setting that cannot run
    ├── ProtocolError (RuntimeError)        a request of the server protocol failed
    │   ├── ServerError                     the server refused it (status and message)
    │   └── Unreachable                     the server could not be reached in time
    ├── StoreError                          the store refused a read or write
    │   ├── NotFound                        an id the store does not know (404)
    │   ├── Conflict                        contradicts the stored state (409)
    │   └── StoreUnavailable                cannot take writes now (503, retryable)
    ├── StoreInUse (RuntimeError)           another server holds the store file
    ├── InvalidTransition (ValueError)      an event the rollout's state does not allow (409)
    ├── AuthError (RuntimeError)            a public listen address without a token
    ├── AddressInUse (RuntimeError)         a server's port is taken
    ├── CommandError (RuntimeError)         a CommandAgent's command failed or printed no reward
    ├── RetokenizeError (ValueError)        a call's text cannot be turned back into its tokens
    ├── ModelLoadError (RuntimeError)       a model could not be found or loaded
    ├── VLLMUnavailable (RuntimeError)      vLLM or a sync mode cannot run here
    ├── NoSFTRowsError (ValueError)         agl sft: no rollout passed the filters
    └── NothingTrainedError (RuntimeError)  a training run ended without one update

Each class is also importable where it has always been (``agl.CommandError``, ``agentlightning.client.ServerError``,
``agentlightning.server.store.StoreError``, ...): those are the same objects. This module imports nothing but the
standard library, so it loads without torch or an agent framework.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AddressInUse",
    "AgentLightningError",
    "AuthError",
    "CommandError",
    "ConfigError",
    "Conflict",
    "InvalidTransition",
    "ModelLoadError",
    "NoSFTRowsError",
    "NotFound",
    "NothingTrainedError",
    "ProtocolError",
    "RetokenizeError",
    "ServerError",
    "StoreError",
    "StoreInUse",
    "StoreUnavailable",
    "Unreachable",
    "VLLMUnavailable",
]


class AgentLightningError(Exception):
    """Base of every error Agent Lightning raises on purpose."""


class ConfigError(AgentLightningError, ValueError):
    """A training setting that cannot run (a :class:`~agentlightning.trainers.config.TrainConfig` field, an
    ``agl.train`` keyword, an ``agl train`` flag, ``--set`` pair or ``--config`` file); the message names the
    setting and the values it accepts."""


# The server protocol (agentlightning.protocol): what a client sees.


class ProtocolError(AgentLightningError, RuntimeError):
    """A request of the server protocol failed."""


class ServerError(ProtocolError):
    """The server refused a request (an error answer that retrying will not fix), with its ``detail`` message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"server answered {status}: {message}")
        self.status = status
        self.message = message


class Unreachable(ProtocolError):
    """The server could not be reached before the retry deadline (or the caller asked to stop)."""


# The server and its store.


class StoreError(AgentLightningError):
    """Base of the store's errors (each maps to a 4xx answer of the server)."""


class NotFound(StoreError):
    """An id that the store does not know."""


class Conflict(StoreError):
    """A request that contradicts the stored state (e.g. a result for a rollout finished by another attempt)."""


class StoreUnavailable(StoreError):
    """The store cannot take writes now (file deleted, read-only or full disk): retryable, answered with a 503."""


class StoreInUse(AgentLightningError, RuntimeError):
    """Another server (another process, or another store object of this one) holds the store file."""


class InvalidTransition(AgentLightningError, ValueError):
    """An event that the rollout's current state does not allow."""


class AuthError(AgentLightningError, RuntimeError):
    """The server was asked to listen publicly without a token."""


class AddressInUse(AgentLightningError, RuntimeError):
    """Another process already listens on the address a server was asked to bind."""


# Running agents and learning from them.


class CommandError(AgentLightningError, RuntimeError):
    """The command exited with a non-zero status, was killed at its timeout, or printed no usable reward."""


class RetokenizeError(AgentLightningError, ValueError):
    """The call's text cannot be turned back into the tokens the model saw."""


class ModelLoadError(AgentLightningError, RuntimeError):
    """A model could not be found or loaded; the message says what was tried."""


class VLLMUnavailable(AgentLightningError, RuntimeError):
    """vLLM cannot be started or a sync mode cannot run here; the message says what to install or use instead."""


class NoSFTRowsError(AgentLightningError, ValueError):
    """Nothing passed the filters: the message says how many rollouts were read and why each set was dropped."""


class NothingTrainedError(AgentLightningError, RuntimeError):
    """A training run ended without one update of the model (``TrainConfig.allow_no_update`` accepts that).
    ``result`` is the run's :class:`~agentlightning.trainers.config.TrainResult`: its metrics, curve and checkpoint
    were written."""

    def __init__(self, result: Any) -> None:  # a TrainResult: not imported, this module stays a leaf
        self.result = result
        reasons = "; ".join(result.warnings()) or "every step had nothing to train on"
        super().__init__(
            f"no step updated the model ({result.steps} steps ran; it is still {result.model_version}): {reasons}. "
            "Pass --allow-no-update (agl.train(allow_no_update=True)) to accept a run that trained nothing"
        )
