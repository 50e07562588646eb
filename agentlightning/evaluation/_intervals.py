"""95% confidence intervals for evaluation scores and their differences, in the standard library alone.

- A share of successes (accuracy): the Wilson score interval, which stays inside [0, 1] and behaves at 0 and n.
- A mean (reward): a percentile bootstrap over the tasks, with a fixed seed so that a report is reproducible.
- A difference of two evaluations: paired over tasks when both scored the same tasks (a bootstrap of the per-task
  differences), else Newcombe's hybrid score interval for two accuracies and an unpaired bootstrap for two means.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence

from pydantic import BaseModel, Field

Z_95 = 1.959963984540054
"""The standard normal's 97.5% quantile: the z of a two-sided 95% interval."""
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0


class Interval(BaseModel):
    """An estimate with its 95% confidence interval and how the interval was computed."""

    value: float = Field(description="The point estimate.")
    low: float = Field(description="Lower end of the 95% interval.")
    high: float = Field(description="Upper end of the 95% interval.")
    method: str = Field(description="'wilson', 'bootstrap', 'paired bootstrap' or 'newcombe'.")

    def text(self, digits: int = 3) -> str:
        """``0.321 [0.254, 0.396]``."""
        return f"{self.value:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


def wilson_interval(successes: int, n: int, z: float = Z_95) -> Interval:
    """Wilson's score interval for ``successes`` out of ``n`` (``n == 0`` gives [0, 1])."""
    if n < 0 or not 0 <= successes <= max(n, 0):
        raise ValueError(f"wilson_interval: need 0 <= successes <= n, got successes={successes}, n={n}")
    if n == 0:
        return Interval(value=0.0, low=0.0, high=1.0, method="wilson")
    share = successes / n
    centre = (share + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(share * (1 - share) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    low, high = max(0.0, min(share, centre - half)), min(1.0, max(share, centre + half))  # float noise at 0 and n
    return Interval(value=share, low=low, high=high, method="wilson")


def bootstrap_mean_interval(values: Sequence[float], resamples: int = BOOTSTRAP_RESAMPLES) -> Interval:
    """The mean of ``values`` with a percentile-bootstrap 95% interval (a single value: a zero-width interval)."""
    values = [float(value) for value in values]
    if not values:
        return Interval(value=0.0, low=0.0, high=0.0, method="bootstrap")
    means = _bootstrap_means(values, resamples)
    return Interval(value=statistics.fmean(values), low=means[0], high=means[1], method="bootstrap")


def paired_difference(before: Sequence[float], after: Sequence[float]) -> Interval:
    """Mean of ``after[i] - before[i]`` over the same tasks, with a bootstrap over the tasks."""
    if len(before) != len(after):
        raise ValueError(f"paired_difference: {len(before)} and {len(after)} values; pair the same tasks")
    differences = [float(b) - float(a) for a, b in zip(before, after, strict=True)]
    interval = bootstrap_mean_interval(differences)
    return interval.model_copy(update={"method": "paired bootstrap"})


def unpaired_mean_difference(before: Sequence[float], after: Sequence[float]) -> Interval:
    """``mean(after) - mean(before)`` of two independent samples, with a bootstrap resampling each."""
    if not before or not after:
        raise ValueError("unpaired_mean_difference: both samples need at least one value")
    rng = random.Random(BOOTSTRAP_SEED)
    diffs = sorted(
        statistics.fmean(rng.choices(after, k=len(after))) - statistics.fmean(rng.choices(before, k=len(before)))
        for _ in range(BOOTSTRAP_RESAMPLES)
    )
    low, high = _percentiles(diffs)
    return Interval(value=statistics.fmean(after) - statistics.fmean(before), low=low, high=high, method="bootstrap")


def newcombe_difference(before: Interval, n_before: int, after: Interval, n_after: int) -> Interval:
    """``after - before`` of two independent Wilson-scored accuracies, by Newcombe's hybrid score method (his
    method 10), from each accuracy's own Wilson interval."""
    if n_before == 0 or n_after == 0:
        raise ValueError("newcombe_difference: both evaluations need at least one task")
    difference = after.value - before.value
    low = difference - math.sqrt((after.value - after.low) ** 2 + (before.high - before.value) ** 2)
    high = difference + math.sqrt((after.high - after.value) ** 2 + (before.value - before.low) ** 2)
    return Interval(value=difference, low=max(-1.0, low), high=min(1.0, high), method="newcombe")


def _bootstrap_means(values: list[float], resamples: int) -> tuple[float, float]:
    if len(set(values)) == 1:
        return values[0], values[0]
    rng = random.Random(BOOTSTRAP_SEED)
    means = sorted(statistics.fmean(rng.choices(values, k=len(values))) for _ in range(resamples))
    return _percentiles(means)


def _percentiles(sorted_values: list[float]) -> tuple[float, float]:
    last = len(sorted_values) - 1
    return sorted_values[round(0.025 * last)], sorted_values[round(0.975 * last)]
