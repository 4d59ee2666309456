"""Bootstrap intervals for SLO terms and goodput, resampling whole requests.

A p99 from a few hundred requests moves by tens of percent between identical runs, so the
recommendation rests on intervals, not on the luckiest run. The resampling unit is the request
(a cluster bootstrap): a request's ITL gaps are correlated, so resampling gaps one by one would
understate the spread. Pure numpy, seeded, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from slo import SLO, Metric, SLOTerm, is_good, measured_latencies, metric_samples, stat_value
from tuner.measure.verdict import Interval, TermVerdict

CONFIDENCE = 0.95
TERM_RESAMPLES = 1000
Draw = np.ndarray | None  # indices of one resample of the requests; None: the requests as run


class RequestSamples:
    """One set of requests' metric samples, kept per request so that a resample is a gather,
    not a recompute. Values follow slo's definitions and percentiles."""

    def __init__(self, records: Sequence[Any]) -> None:
        self.lats = measured_latencies(records)
        self.ok = np.array([lat.ok for lat in self.lats], dtype=bool)
        self.per_metric = {m: _Ragged([metric_samples([lat], m) for lat in self.lats])
                           for m in Metric}  # fmt: skip

    def __len__(self) -> int:
        return len(self.lats)

    def draw(self, rng: np.random.Generator) -> np.ndarray:
        return rng.integers(0, len(self), size=len(self))

    def term_value(self, term: SLOTerm, idx: Draw = None) -> float:
        """slo.term_result's value for this (re)sample of requests."""
        return pooled_term_value([(self, idx)], term)

    def error_rate(self, idx: Draw = None) -> float:
        return pooled_error_rate([(self, idx)])


class _Ragged:
    """Per-request sample lists as one flat array, so a resample of requests is one gather."""

    def __init__(self, rows: Sequence[Sequence[float]]) -> None:
        self.lens = np.array([len(r) for r in rows], dtype=np.int64)
        self.starts = np.concatenate(([0], np.cumsum(self.lens)[:-1])).astype(np.int64)
        self.flat = np.fromiter((v for r in rows for v in r), np.float64, int(self.lens.sum()))

    def take(self, idx: Draw) -> np.ndarray:
        """The samples of requests `idx` (all of them for None), concatenated."""
        if idx is None:
            return self.flat
        lens = self.lens[idx]
        total = int(lens.sum())
        if total == 0:
            return self.flat[:0]
        # Each chosen request's samples are starts[i] .. starts[i] + lens[i] - 1.
        offsets = np.repeat(self.starts[idx] - (np.cumsum(lens) - lens), lens)
        return self.flat[offsets + np.arange(total)]


Part = tuple[RequestSamples, Draw]  # one run's requests, as run or resampled


def pooled_term_value(parts: Sequence[Part], term: SLOTerm) -> float:
    """slo.term_result's value over several runs' (re)sampled requests pooled."""
    chosen = [s.per_metric[term.metric].take(idx) for s, idx in parts]
    pooled = np.concatenate(chosen) if chosen else np.empty(0)
    if pooled.size:
        return stat_value(pooled, term.stat)  # type: ignore[arg-type]  # an array is a sequence
    # slo.term_result's rule: finished requests without samples count as 0, none as inf.
    return 0.0 if any(_oks(s, idx).any() for s, idx in parts) else math.inf


def pooled_error_rate(parts: Sequence[Part]) -> float:
    """slo's RunMetrics.error_rate (the failed share; 0 for no requests) over the parts."""
    oks = np.concatenate([_oks(s, idx) for s, idx in parts]) if parts else np.empty(0)
    return int(np.count_nonzero(~oks)) / oks.size if oks.size else 0.0


def _oks(samples: RequestSamples, idx: Draw) -> np.ndarray:
    return samples.ok if idx is None else samples.ok[idx]


def term_intervals(
    samples: RequestSamples, slo: SLO, n_boot: int = TERM_RESAMPLES, seed: int = 0
) -> tuple[TermVerdict, ...]:
    """Each SLO term over the requests, with its interval."""
    rng = np.random.default_rng(seed)
    draws = [samples.draw(rng) for _ in range(n_boot)] if len(samples) else []
    out = []
    for term in slo.terms:
        point = samples.term_value(term)
        boots = np.array([samples.term_value(term, idx) for idx in draws] or [point])
        out.append(TermVerdict(term, point, Interval(point, *bounds(boots))))
    return tuple(out)


def goodput_interval(
    records: Sequence[Any], slo: SLO, n_boot: int = TERM_RESAMPLES, seed: int = 0
) -> Interval:
    """vLLM's goodput (good requests / run duration) with the duration held fixed."""
    lats = measured_latencies(records)
    if not lats:
        return Interval(0.0, 0.0, 0.0)
    duration = max(lat.end_s for lat in lats) - min(lat.sent_s for lat in lats)
    if duration <= 0:
        return Interval(0.0, 0.0, 0.0)
    good = np.array([is_good(lat, slo) for lat in lats], dtype=np.float64)
    rng = np.random.default_rng(seed)
    boots = good[rng.integers(0, good.size, size=(n_boot, good.size))].sum(axis=1) / duration
    return Interval(float(good.sum() / duration), *bounds(boots))


def bounds(values: np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The interval's ends from bootstrap replicates.

    Order statistics, not interpolation: an infinite resample (nothing succeeded) must not turn
    a bound into NaN, and the outer order statistic errs on the cautious side.
    """
    alpha = (1.0 - confidence) / 2.0
    low = np.quantile(values, alpha, method="lower")
    high = np.quantile(values, 1.0 - alpha, method="higher")
    return float(low), float(high)
