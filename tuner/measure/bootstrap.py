"""Bootstrap confidence intervals for SLO percentiles, capacity and goodput.

A p99 from a few hundred requests moves by tens of percent between identical runs, so the
recommendation rests on intervals, not on the luckiest run. The resampling unit is the request
(a cluster bootstrap): a request's ITL gaps are correlated, so resampling gaps one by one would
understate the spread. Pure numpy, seeded, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from slo import (
    SLO,
    Metric,
    RequestLatency,
    SLOTerm,
    is_good,
    measured_latencies,
    metric_samples,
    stat_value,
)
from tuner.measure.keepup import MIN_SERVED_FRACTION, served_fraction

DEFAULT_CONFIDENCE = 0.95
DEFAULT_BOOTSTRAP = 1000
# Each capacity resample re-judges every level; 400 keep the 2.5% tails at 10 draws each.
CAPACITY_BOOTSTRAP = 400


@dataclass(frozen=True)
class Interval:
    """A point estimate with its two-sided bootstrap interval."""

    point: float
    low: float
    high: float

    def as_dict(self) -> dict[str, float | None]:
        return {k: _json_float(v) for k, v in (("point", self.point), ("low", self.low),
                                                ("high", self.high))}  # fmt: skip


@dataclass(frozen=True)
class TermInterval:
    """One SLO term's statistic with its interval; `clears` when the whole interval holds."""

    term: str  # "tpot_p99=30ms"
    metric: str  # "tpot_p99"
    limit_s: float
    value_s: Interval

    @property
    def clears(self) -> bool:
        return self.value_s.high <= self.limit_s

    @property
    def margin_frac(self) -> float:
        return (self.limit_s - self.value_s.point) / self.limit_s


class _Samples:
    """Per-request samples of each metric, so a resample is a concatenation, not a recompute."""

    def __init__(self, lats: list[RequestLatency]) -> None:
        self.lats = lats
        self.per_metric = {
            m: [np.asarray(metric_samples([lat], m), dtype=np.float64) for lat in lats]
            for m in Metric
        }

    def stat(self, term: SLOTerm, idx: np.ndarray | None) -> float:
        arrays = self.per_metric[term.metric]
        chosen = arrays if idx is None else [arrays[i] for i in idx]
        pooled = np.concatenate(chosen) if chosen else np.empty(0)
        if pooled.size:
            return stat_value(pooled.tolist(), term.stat)
        oks = self.lats if idx is None else [self.lats[i] for i in idx]
        # slo.term_result's rule: finished requests without samples count as 0, none as inf.
        return 0.0 if any(lat.ok for lat in oks) else math.inf


def term_intervals(
    records: Sequence[Any],
    slo: SLO,
    confidence: float = DEFAULT_CONFIDENCE,
    n_boot: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
) -> list[TermInterval]:
    """Each SLO term over the pooled records of one config at one rate, with its interval."""
    samples = _Samples(measured_latencies(records))
    n = len(samples.lats)
    rng = np.random.default_rng(seed)
    draws = [rng.integers(0, n, size=n) for _ in range(n_boot)] if n else []
    out = []
    for term in slo.terms:
        point = samples.stat(term, None)
        boots = np.array([samples.stat(term, idx) for idx in draws]) if draws else np.array([point])
        low, high = _quantiles(boots, confidence)
        out.append(TermInterval(str(term), term.name, term.limit_s, Interval(point, low, high)))
    return out


def capacity_interval(
    levels: Sequence[tuple[float, Sequence[Any]]],
    slo: SLO,
    max_error_rate: float,
    min_served: float = MIN_SERVED_FRACTION,
    confidence: float = DEFAULT_CONFIDENCE,
    n_boot: int = CAPACITY_BOOTSTRAP,
    seed: int = 0,
) -> Interval:
    """Capacity from measured levels (rate, records), resampling each level's requests.

    In each resample a rate passes when every term holds over its pooled runs, errors stay
    under `max_error_rate` and the runs kept up (mean served fraction >= `min_served`, each
    run on its own clock); capacity is the highest passing rate below the lowest failing one,
    the rate search's rule. The interval's resolution is that of the measured rates.
    """
    runs: dict[float, list[list[Any]]] = {}
    for rate, recs in levels:
        runs.setdefault(rate, []).append([r for r in recs if not getattr(r, "warmup", False)])
    rates = sorted(runs)
    rng = np.random.default_rng(seed)

    def capacity(draw: bool) -> float:
        passed = []
        for rate in rates:
            chosen = [_draw(run, rng) if draw else run for run in runs[rate]]
            passed.append(_rate_passes(chosen, slo, max_error_rate, min_served))
        return _envelope(rates, passed)

    point = capacity(draw=False)
    boots = np.array([capacity(draw=True) for _ in range(n_boot)])
    low, high = _quantiles(boots, confidence)
    return Interval(point, low, high)


def _draw(run: list[Any], rng: np.random.Generator) -> list[Any]:
    return [run[i] for i in rng.integers(0, len(run), size=len(run))] if run else run


def _rate_passes(runs: list[list[Any]], slo: SLO, max_error_rate: float, min_served: float) -> bool:
    pooled = [r for run in runs for r in run]
    if not pooled:
        return False
    served = float(np.mean([served_fraction(run) for run in runs]))
    samples = _Samples(measured_latencies(pooled))
    return served >= min_served and _level_passes(samples, None, slo, max_error_rate)


def goodput_interval(
    records: Sequence[Any],
    slo: SLO,
    confidence: float = DEFAULT_CONFIDENCE,
    n_boot: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
) -> Interval:
    """vLLM's goodput (good requests / run duration) with the duration held fixed."""
    lats = measured_latencies(records)
    if not lats:
        return Interval(0.0, 0.0, 0.0)
    start = min(lat.sent_s for lat in lats)
    end = max(lat.end_s for lat in lats)
    duration = end - start
    good = np.array([is_good(lat, slo) for lat in lats], dtype=np.float64)
    if duration <= 0:
        return Interval(0.0, 0.0, 0.0)
    rng = np.random.default_rng(seed)
    boots = good[rng.integers(0, good.size, size=(n_boot, good.size))].sum(axis=1) / duration
    low, high = _quantiles(boots, confidence)
    return Interval(float(good.sum() / duration), low, high)


def _level_passes(s: _Samples, idx: np.ndarray | None, slo: SLO, max_error_rate: float) -> bool:
    lats = s.lats if idx is None else [s.lats[i] for i in idx]
    if not lats:
        return False
    failed = sum(not lat.ok for lat in lats) / len(lats)
    if failed >= max_error_rate:
        return False
    return all(s.stat(term, idx) <= term.limit_s for term in slo.terms)


def _envelope(rates: list[float], passed: list[bool]) -> float:
    upper = min((r for r, ok in zip(rates, passed, strict=True) if not ok), default=math.inf)
    return max((r for r, ok in zip(rates, passed, strict=True) if ok and r < upper), default=0.0)


def _quantiles(values: np.ndarray, confidence: float) -> tuple[float, float]:
    alpha = (1.0 - confidence) / 2.0
    # Order statistics, not interpolation: an infinite resample (nothing succeeded) must not
    # turn a bound into NaN, and the outer order statistic errs on the cautious side.
    low = np.quantile(values, alpha, method="lower")
    high = np.quantile(values, 1.0 - alpha, method="higher")
    return float(low), float(high)


def _json_float(value: float) -> float | None:
    return value if math.isfinite(value) else None
