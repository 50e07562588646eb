"""Prometheus-style metrics: labelled counters and summaries rendered in the text exposition format."""

from __future__ import annotations

import threading
from collections.abc import Callable

_ESCAPES = str.maketrans({"\\": "\\\\", '"': '\\"', "\n": "\\n"})  # of label values


class Metrics:
    """A tiny thread-safe registry. Counters and sums are keyed by (name, sorted labels)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._help: dict[str, tuple[str, str]] = {}
        self._values: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
        self._gauges: list[Callable[[], list[tuple[str, dict[str, str], float]]]] = []

    def describe(self, name: str, kind: str, text: str) -> None:
        """Declare a metric (kind: 'counter', 'gauge' or 'summary')."""
        self._help[name] = (kind, text)

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        """Add ``value`` to a counter."""
        key = tuple(sorted(labels.items()))
        with self._lock:
            series = self._values.setdefault(name, {})
            series[key] = series.get(key, 0.0) + value

    def observe(self, name: str, seconds: float, **labels: str) -> None:
        """Record one observation of a summary (exposed as ``_sum`` and ``_count``)."""
        self.inc(f"{name}_sum", seconds, **labels)
        self.inc(f"{name}_count", 1.0, **labels)

    def total(self, name: str) -> float:
        """The sum of a counter over all its labels (0 when it was never incremented)."""
        with self._lock:
            return sum(self._values.get(name, {}).values())

    def add_gauges(self, collect: Callable[[], list[tuple[str, dict[str, str], float]]]) -> None:
        """Register a function returning (name, labels, value) gauge samples at scrape time."""
        self._gauges.append(collect)

    def render(self) -> str:
        """The text exposition format."""
        lines: list[str] = []
        with self._lock:
            snapshot = {name: dict(series) for name, series in self._values.items()}
        for collect in self._gauges:
            for name, labels, value in collect():
                snapshot.setdefault(name, {})[tuple(sorted(labels.items()))] = value
        described: set[str] = set()
        for name in sorted(snapshot):
            base = name.removesuffix("_sum").removesuffix("_count")
            if base in self._help and base not in described:
                kind, text = self._help[base]
                lines += [f"# HELP {base} {text}", f"# TYPE {base} {kind}"]
                described.add(base)
            for key, value in sorted(snapshot[name].items()):
                label_text = ",".join(f'{k}="{v.translate(_ESCAPES)}"' for k, v in key)
                lines.append(f"{name}{{{label_text}}} {value:g}" if label_text else f"{name} {value:g}")
        return "\n".join(lines) + "\n"
