"""Percentiles and summaries of latency samples, computed the way `vllm bench serve` does."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from slo.grammar import Stat


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with numpy's default linear interpolation.

    vLLM's `calculate_metrics` (vllm/benchmarks/serve.py) calls `np.percentile(x, p)` with the
    default method ("linear"), so this is the same number. NaN for no samples: an empty
    distribution has no percentile (vLLM reports 0 there, which would pass any SLO).
    """
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q={q!r} is outside 0..100")
    if len(values) == 0:
        return math.nan
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def stat_value(values: Sequence[float], stat: Stat) -> float:
    """`stat` (a percentile or the mean) of the samples; NaN when there are none."""
    if len(values) == 0:
        return math.nan
    q = stat.percentile
    if q is None:
        return float(np.mean(np.asarray(values, dtype=np.float64)))
    return percentile(values, q)


@dataclass(slots=True, frozen=True)
class LatencySummary:
    """One metric's distribution over a run, in seconds (NaN everywhere when empty)."""

    count: int
    mean_s: float
    std_s: float
    median_s: float
    p90_s: float
    p95_s: float
    p99_s: float
    p999_s: float
    max_s: float

    @classmethod
    def of(cls, values: Sequence[float]) -> LatencySummary:
        """Summarize samples; `std_s` is numpy's population std, as vLLM reports it."""
        if len(values) == 0:
            nan = math.nan
            return cls(0, nan, nan, nan, nan, nan, nan, nan, nan)
        arr = np.asarray(values, dtype=np.float64)
        p50, p90, p95, p99, p999 = np.percentile(arr, [50, 90, 95, 99, 99.9])
        return cls(
            count=int(arr.size),
            mean_s=float(arr.mean()),
            std_s=float(arr.std()),
            median_s=float(p50),
            p90_s=float(p90),
            p95_s=float(p95),
            p99_s=float(p99),
            p999_s=float(p999),
            max_s=float(arr.max()),
        )
