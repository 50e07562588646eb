"""JSON at the boundaries. :func:`loads` is the one reader for what clients send the server: it refuses what the
server could not store and write back (lone UTF-16 surrogates such as ``"\\ud83d"``, ``NaN`` / ``Infinity``, nesting
deeper than :data:`MAX_DEPTH`). :func:`scrub` makes text a process produced itself (an agent's logs, an upstream's
answer) safe to send and store: lone surrogates become U+FFFD."""

from __future__ import annotations

from typing import Any

import pydantic_core

MAX_DEPTH = 200  # pydantic-core's parser refuses deeper nesting; its serialiser stops at 255
_REFUSED = "lone UTF-16 surrogates such as \\ud83d, NaN and Infinity, and nesting deeper than 200 are refused"


def loads(raw: bytes | str, what: str = "request body") -> Any:
    """``raw`` parsed strictly; a ``ValueError`` naming ``what``, the position and the rule broken otherwise."""
    try:
        return pydantic_core.from_json(raw, allow_inf_nan=False)
    except ValueError as exc:
        raise ValueError(f"{what} is not valid JSON ({_REFUSED}): {exc}") from None


def scrub(value: Any) -> Any:
    """``value`` (made of JSON types) with lone surrogates in its strings (keys too) replaced by U+FFFD."""
    if isinstance(value, str):
        return scrub_text(value)
    if isinstance(value, dict):
        return {scrub_text(key) if isinstance(key, str) else key: scrub(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub(item) for item in value]
    return value


def scrub_text(text: str) -> str:
    """``text`` with lone surrogates replaced by U+FFFD (a surrogate pair becomes the character it encodes)."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text
