"""Summaries of samples: medians and tail percentiles, and ratios that tolerate a zero."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100), linear between closest ranks."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    if len(ordered) == 1:
        return float(ordered[0])
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return float(ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo))


def summary(samples: Sequence[float], scale: float = 1.0, digits: int = 3) -> dict[str, Any]:
    """n, median, p90, p99, min, max and mean of ``samples`` times ``scale`` (e.g. 1000 for
    seconds to milliseconds)."""
    if not samples:
        return {"n": 0, "median": None, "p90": None, "p99": None, "min": None, "max": None,
                "mean": None}
    values = [s * scale for s in samples]

    def r(x: float) -> float:
        return round(x, digits)

    return {
        "n": len(values),
        "median": r(statistics.median(values)),
        "p90": r(percentile(values, 90)),
        "p99": r(percentile(values, 99)),
        "min": r(min(values)),
        "max": r(max(values)),
        "mean": r(statistics.fmean(values)),
    }


def ratio(numerator: float | None, denominator: float | None,
          digits: int | None = None) -> float | None:
    """numerator / denominator, or None when either is missing or the denominator is 0.
    Unrounded unless ``digits`` is given: goals are judged on these values (a 0.254 must not
    pass a 0.25 goal as a rounded 0.25); the Markdown tables round what they show."""
    if numerator is None or denominator is None or denominator == 0:
        return None
    value = numerator / denominator
    return value if digits is None else round(value, digits)
