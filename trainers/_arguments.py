"""``TrainConfig`` fields as command-line options: the flags of ``agl train`` and ``agl server --model``.

Each field ``max_steps`` is the flag ``--max-steps``, its help the field's docstring and its default the field's
default, so the command line, ``--set`` pairs, config files and ``agl.train`` keywords cannot drift apart. A flag
given on the command line replaces the ``--config`` file's value; ``--set FIELD=VALUE`` (any field, also nested
ones such as ``vllm.sync``) replaces both.
"""

from __future__ import annotations

import argparse
import ast
import functools
import inspect
import json
import re
import textwrap
from collections.abc import Collection
from dataclasses import MISSING, Field, fields
from typing import Any

from agentlightning.trainers.config import TrainConfig, config_options

NOT_FLAGS = frozenset({"tokenizer", "accuracy", "air", "vllm"})
"""Fields that hold Python objects or a group of settings: given in Python, in ``--config`` or by ``--set``
(``--set vllm.sync=disk``)."""


def add_train_arguments(parser: argparse.ArgumentParser, exclude: Collection[str] = ()) -> None:
    """Add one flag per :class:`TrainConfig` field (but ``exclude`` and :data:`NOT_FLAGS`), ``--config`` and
    ``--set`` to ``parser``, in a group of their own."""
    group = parser.add_argument_group(
        "training options (TrainConfig fields; --set FIELD=VALUE sets any field, e.g. vllm.sync=disk)"
    )
    group.add_argument("--config", help="JSON (or YAML, with PyYAML) file of TrainConfig fields")
    group.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="a TrainConfig field (value read as JSON, else text), e.g. group_size=8, vllm.sync=disk",
    )
    docs = field_docs()
    for item in fields(TrainConfig):
        if item.name in NOT_FLAGS or item.name in exclude:
            continue
        flag = "--" + item.name.replace("_", "-")
        help_text = _escape(f"{docs.get(item.name, '')} (default: {_default_text(item)})".strip())
        kind = str(item.type)
        options: dict[str, Any] = {"dest": f"config.{item.name}", "default": argparse.SUPPRESS, "help": help_text}
        if kind == "bool":
            group.add_argument(flag, action=argparse.BooleanOptionalAction, **options)
        elif kind in ("int", "float", "str", "str | Path"):
            group.add_argument(flag, type=_TYPES[kind], metavar=_metavar(item), **options)
        elif kind in ("int | None", "float | None"):
            group.add_argument(flag, type=_optional(_TYPES[kind.split()[0]]), metavar=_metavar(item), **options)
        elif "Sequence[str]" in kind:
            group.add_argument(flag, nargs="+", metavar=_metavar(item), **options)
        elif kind == "bool | str | Path":  # resume: the flag alone means True, or a checkpoint path
            group.add_argument(flag, nargs="?", const=True, metavar="CHECKPOINT", **options)
        else:
            group.add_argument(flag, type=_json_or_text, metavar=_metavar(item), **options)


def train_options(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`TrainConfig` fields given as flags (those left out keep the config file's or the default)."""
    return {key.removeprefix("config."): value for key, value in vars(args).items() if key.startswith("config.")}


def options_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The field values of ``--config``, then the flags, then ``--set`` (not yet checked)."""
    return config_options(args.config, args.sets, flags=train_options(args))


@functools.cache
def field_docs() -> dict[str, str]:
    """Each :class:`TrainConfig` field's docstring (the string literal under it), on one line."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(TrainConfig)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, following in zip(body, body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            text = re.sub(r":\w+:`~?([^`]+)`", lambda m: m.group(1).split(".")[-1], following.value.value)
            docs[node.target.id] = " ".join(text.replace("``", "").split())
    return docs


_TYPES: dict[str, Any] = {"int": int, "float": float, "str": str, "str | Path": str}


def _default_text(item: Field[Any]) -> str:
    value = item.default if item.default_factory is MISSING else item.default_factory()
    if value in ((), [], {}) and item.name == "report_to":
        return "none"
    return json.dumps(value) if isinstance(value, dict) else str(value)


def _metavar(item: Field[Any]) -> str:
    return item.name.upper()


def _escape(text: str) -> str:
    return text.replace("%", "%%")  # argparse formats help strings with %


def _optional(kind: Any) -> Any:
    def parse(text: str) -> Any:
        return None if text.lower() in ("none", "null") else kind(text)

    parse.__name__ = kind.__name__  # argparse names the type in its error message
    return parse


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text
