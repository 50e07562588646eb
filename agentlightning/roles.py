"""Role selection: exact names and glob patterns such as ``"sql_*"``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from fnmatch import fnmatchcase


def role_matches(role: str | None, patterns: Sequence[str] | None) -> bool:
    """Whether ``role`` is selected by ``patterns`` (None selects every role, including unnamed calls)."""
    if patterns is None:
        return True
    if role is None:
        return False
    return any(role == pattern or fnmatchcase(role, pattern) for pattern in patterns)


def unmatched_patterns(patterns: Sequence[str], roles_seen: Iterable[str | None]) -> list[str]:
    """The patterns that select none of ``roles_seen``."""
    seen = [role for role in roles_seen if role is not None]
    return [pattern for pattern in patterns if not any(role_matches(role, [pattern]) for role in seen)]
