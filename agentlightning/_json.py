"""JSON at the boundaries. :func:`loads` is the one reader for what clients send the server: it refuses what the
server could not store and write back (lone UTF-16 surrogates such as ``"\\ud83d"``, ``NaN`` / ``Infinity``, numbers
too large for a float, nesting deeper than :data:`MAX_DEPTH`). :func:`scrub` makes text a process produced itself (an
agent's logs, an upstream's answer) safe to send and store: lone surrogates become U+FFFD. :func:`non_finite` finds
the NaN and Infinity in data a process made itself, which JSON cannot carry."""

from __future__ import annotations

import math
from typing import Any

import pydantic_core

MAX_DEPTH = 200  # pydantic-core's parser refuses deeper nesting; its serialiser stops at 255
_REFUSED = "lone UTF-16 surrogates such as \\ud83d, NaN and Infinity, and nesting deeper than 200 are refused"


# A number literal can overflow a float to infinity only with a 3-digit exponent or 309 digits in a row. Text mapped
# digits -> "0", "e"/"E" -> "e" and the rest (but "+") -> " " shows either with a plain substring search (C speed,
# ~1 ms a MB: a regular expression takes 25); only text that may hold one is searched for the overflowed value.
_NUMBER_SHAPE = bytes(
    ord("0") if chr(c).isdigit() and c < 128 else ord("e") if c in b"eE" else c if c == ord("+") else ord(" ")
    for c in range(256)
)
_OVERFLOW_SHAPES = (b"e000", b"e+000", b"0" * 309)


def _may_overflow(raw: bytes | str) -> bool:
    data = raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass")
    shape = data.translate(_NUMBER_SHAPE)
    return any(pattern in shape for pattern in _OVERFLOW_SHAPES)


def loads(raw: bytes | str, what: str = "request body") -> Any:
    """``raw`` parsed strictly; a ``ValueError`` naming ``what``, the position or field, and the rule broken
    otherwise."""
    try:
        value = pydantic_core.from_json(raw, allow_inf_nan=False)
    except ValueError as exc:
        raise ValueError(f"{what} is not valid JSON ({_REFUSED}): {exc}") from None
    where = non_finite(value, limit=3) if _may_overflow(raw) else []
    if where:
        raise ValueError(
            f"{what}: the number at {', '.join(where)} is too large for a 64-bit float (it would be Infinity, which "
            "cannot be stored); send a finite number"
        )
    return value


def non_finite(value: Any, path: str = "", limit: int = 10) -> list[str]:
    """Where ``value`` (made of JSON types) holds NaN or an infinity, as paths such as ``output.scores[2]`` (at most
    ``limit`` of them)."""
    found: list[str] = []
    _find_non_finite(value, path, found, limit)
    return found


def _find_non_finite(value: Any, path: str, found: list[str], limit: int) -> None:
    if isinstance(value, float):
        if not math.isfinite(value) and len(found) < limit:
            found.append(path or "the value")
    elif isinstance(value, dict):
        for key, item in value.items():
            if len(found) < limit and not isinstance(item, (str, int, type(None))):
                _find_non_finite(item, f"{path}.{key}" if path else str(key), found, limit)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            if len(found) < limit and not isinstance(item, (str, int, type(None))):
                _find_non_finite(item, f"{path}[{index}]", found, limit)


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
