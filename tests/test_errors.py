"""One exception tree: every error the library raises on purpose is an ``agentlightning.errors`` class under
``AgentLightningError``, keeps its builtin base, stays importable where it shipped, and the module loads alone."""

from __future__ import annotations

import ast
import builtins
import importlib
import subprocess
import sys
from pathlib import Path

import pytest
from agentlightning.trainers.config import TrainConfig

import agentlightning as agl
from agentlightning import errors
from agentlightning.client import ServerAPI
from agentlightning.errors import AgentLightningError
from agentlightning.server import LightningServer
from agentlightning.server._auth import check_bind
from agentlightning.server.store import SQLiteStore

ROOT = Path(__file__).resolve().parents[1]

# Exceptions that never leave the module raising them: each is turned into an HTTP answer right there.
INTERNAL = {
    ("agentlightning/server/_errors.py", "OpenAIError"),  # a Starlette HTTPException answered in the OpenAI format
    ("trainers/backends/hf/server.py", "BadRequest"),  # caught by the HF backend's handlers, answered with a 400
    ("agentlightning/server/_proxy.py", "_GivenUp"),  # the proxy giving up an upstream answer, answered there
    ("adapters/_lm15.py", "HTTPStatusError"),  # the error a DSPy call's record carries, never raised
    # A KeyboardInterrupt, not an error: SIGTERM/SIGHUP stopping agl.train as Ctrl-C does (`except Exception` must not
    # swallow it); the CLI turns it into the signal's exit code.
    ("agentlightning/_signals.py", "Stopped"),
}

# The builtin base each error had before the tree existed: `except ValueError` / `except RuntimeError` still work.
BUILTIN_BASE = {
    "ConfigError": ValueError,
    "ProtocolError": RuntimeError,
    "ServerError": RuntimeError,
    "Unreachable": RuntimeError,
    "StoreInUse": RuntimeError,
    "InvalidTransition": ValueError,
    "AuthError": RuntimeError,
    "AddressInUse": RuntimeError,
    "CommandError": RuntimeError,
    "RetokenizeError": ValueError,
    "ModelLoadError": RuntimeError,
    "VLLMUnavailable": RuntimeError,
    "NoSFTRowsError": ValueError,
    "NothingTrainedError": RuntimeError,
}

# Where each error was importable before it moved to agentlightning.errors (the same class is still there).
SHIPPED = [
    ("agentlightning", "CommandError"),
    ("agentlightning", "NothingTrainedError"),
    ("agentlightning.protocol", "ProtocolError"),
    ("agentlightning.protocol", "ServerError"),
    ("agentlightning.protocol", "Unreachable"),
    ("agentlightning.client", "ServerError"),
    ("agentlightning.server.store", "StoreError"),
    ("agentlightning.server.store", "NotFound"),
    ("agentlightning.server.store", "Conflict"),
    ("agentlightning.server.store", "StoreUnavailable"),
    ("agentlightning.server.store", "StoreInUse"),
    ("agentlightning.rl.tokens", "RetokenizeError"),
    ("agentlightning.trainers.config", "NothingTrainedError"),
    ("agentlightning.trainers.models", "ModelLoadError"),
    ("agentlightning.trainers.backends.vllm.server", "VLLMUnavailable"),
]


def _is_exception_base(base: ast.expr) -> bool:
    name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else ""
    builtin = getattr(builtins, name, None)
    return (
        (isinstance(builtin, type) and issubclass(builtin, BaseException))
        or name in errors.__all__
        or name.endswith(("Error", "Exception"))
    )


def _exception_classes() -> set[tuple[str, str]]:
    """(file, class) of every class in the library's source that derives from an exception."""
    found = set()
    for package in ("agentlightning", "adapters", "trainers"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ClassDef) and any(_is_exception_base(base) for base in node.bases):
                    found.add((path.relative_to(ROOT).as_posix(), node.name))
    return found


def test_every_exception_class_of_the_library_is_defined_in_errors() -> None:
    found = _exception_classes()
    defined_here = {name for file, name in found if file == "agentlightning/errors.py"}
    assert defined_here == set(errors.__all__)
    elsewhere = {entry for entry in found if entry[0] != "agentlightning/errors.py"}
    assert elsewhere == INTERNAL, f"define these in agentlightning/errors.py: {sorted(elsewhere - INTERNAL)}"


@pytest.mark.parametrize("name", errors.__all__)
def test_every_public_error_is_under_the_root_and_keeps_its_builtin_base(name: str) -> None:
    cls = getattr(errors, name)
    assert issubclass(cls, AgentLightningError) and cls.__module__ == "agentlightning.errors"
    if name in BUILTIN_BASE:
        assert issubclass(cls, BUILTIN_BASE[name])
    assert cls.__doc__, f"{name} needs a docstring"


def test_store_errors_keep_their_family() -> None:
    for name in ("NotFound", "Conflict", "StoreUnavailable"):
        assert issubclass(getattr(errors, name), errors.StoreError)
    assert issubclass(errors.ServerError, errors.ProtocolError) and issubclass(errors.Unreachable, errors.ProtocolError)
    assert agl.AgentLightningError is AgentLightningError


@pytest.mark.parametrize(("module", "name"), SHIPPED)
def test_errors_are_still_importable_where_they_shipped(module: str, name: str) -> None:
    assert getattr(importlib.import_module(module), name) is getattr(errors, name)


def test_errors_import_without_torch_or_any_framework() -> None:
    probe = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import agentlightning.errors\n"
        "print('\\n'.join(m for m in set(sys.modules) - before if m.split('.')[0] not in sys.stdlib_module_names))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    assert set(result.stdout.split()) == {"agentlightning", "agentlightning.errors"}  # nothing outside the stdlib


def test_real_failures_are_caught_by_the_root(tmp_path: Path) -> None:
    with pytest.raises(AgentLightningError, match="group_size=1"):
        TrainConfig(group_size=1)
    with pytest.raises(ValueError, match="group_size=1"):  # the builtin base it always had
        TrainConfig(group_size=1)
    with pytest.raises(AgentLightningError, match="without a token"):
        check_bind("0.0.0.0", None)
    store = SQLiteStore(tmp_path / "store.db")
    try:
        with pytest.raises(AgentLightningError, match="ds-nope"):
            store.dataset_tasks("ds-nope")
    finally:
        store.close()
    with LightningServer(tmp_path / "server.db") as server:
        api = ServerAPI(server.url)
        try:
            with pytest.raises(AgentLightningError, match="404"):
                api.request("GET", "/datasets/ds-nope", retry_for=5.0)
        finally:
            api.close()
