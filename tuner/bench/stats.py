"""Noise-aware regression verdicts: a change is called only when its confidence interval says so.

A CI benchmark on a shared machine sees run-to-run noise of several percent. Comparing two single
numbers against a tolerance therefore cries wolf. Instead each figure is measured several times;
we bootstrap the relative change of the mean (of log values, so a ratio is symmetric) and call a
regression only when the whole interval lies beyond the tolerance on the bad side.
"""

from __future__ import annotations

import enum
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tuner.errors import TuneError


class Verdict(enum.StrEnum):
    """Outcome of comparing one figure against its baseline."""

    OK = "ok"  # any change is within tolerance, or the interval straddles it
    REGRESSION = "regression"  # confidently worse by more than the tolerance
    IMPROVEMENT = "improvement"  # confidently better by more than the tolerance


@dataclass(slots=True, frozen=True)
class Comparison:
    """Relative change of one figure: `worse_frac` > 0 means worse, whatever its direction."""

    figure: str
    baseline_median: float
    current_median: float
    worse_frac: float  # point estimate: 0.2 = 20% worse
    worse_lo: float  # confidence interval of worse_frac
    worse_hi: float
    change_frac: float  # the figure's own change, current / baseline - 1 (0.1 = 10% higher)
    change_lo: float
    change_hi: float
    tolerance: float
    verdict: Verdict


def _log_samples(values: Sequence[float], figure: str) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        raise TuneError(f"figure {figure!r} has no samples; measure it at least once")
    # A latency of 0 or a capacity of 0 (nothing met the SLO) has no log; floor it at a tiny value
    # so the comparison still says "much worse" instead of crashing.
    return np.log(np.maximum(arr, 1e-9))


def bootstrap_log_ratio(baseline: Sequence[float], current: Sequence[float], *,
                        figure: str = "figure", confidence: float = 0.95, n_boot: int = 4000,
                        seed: int = 0) -> tuple[float, float, float]:  # fmt: skip
    """Point estimate and percentile-bootstrap interval of log(mean-of-logs ratio) current/baseline.

    Both samples are resampled independently (they come from different runs). The seed is fixed so
    the same samples always give the same verdict.
    """
    b = _log_samples(baseline, figure)
    c = _log_samples(current, figure)
    rng = np.random.default_rng(seed)
    b_means = b[rng.integers(0, b.size, size=(n_boot, b.size))].mean(axis=1)
    c_means = c[rng.integers(0, c.size, size=(n_boot, c.size))].mean(axis=1)
    diffs = c_means - b_means
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(diffs, [alpha, 1.0 - alpha])
    return float(c.mean() - b.mean()), float(lo), float(hi)


def compare_figure(figure: str, baseline: Sequence[float], current: Sequence[float], *,
                   higher_is_better: bool, tolerance: float, confidence: float = 0.95,
                   min_noise_frac: float = 0.0) -> Comparison:  # fmt: skip
    """Compare one figure's samples; `tolerance` is a fraction (0.05 = 5%).

    `min_noise_frac` widens the interval by a known floor of run-to-run noise, for figures measured
    too few times for the bootstrap to see their spread (with one sample a side it sees none).
    """
    if tolerance < 0:
        raise TuneError(f"tolerance {tolerance!r} is negative; give a fraction such as 0.05")
    point, lo, hi = bootstrap_log_ratio(baseline, current, figure=figure, confidence=confidence)
    change_lo = math.expm1(lo) - min_noise_frac
    change_hi = math.expm1(hi) + min_noise_frac
    # "Fraction worse" whatever the direction: for a capacity a drop is worse, for a latency a rise.
    if higher_is_better:
        worse_frac, worse_lo, worse_hi = -math.expm1(point), -change_hi, -change_lo
    else:
        worse_frac, worse_lo, worse_hi = math.expm1(point), change_lo, change_hi
    verdict = _verdict(worse_lo, worse_hi, tolerance)
    medians = float(statistics.median(baseline)), float(statistics.median(current))
    return Comparison(figure, *medians, worse_frac, worse_lo, worse_hi, math.expm1(point),
                      change_lo, change_hi, tolerance, verdict)  # fmt: skip


def compare_exact(figure: str, baseline: float, current: float, *, higher_is_better: bool,
                  tolerance: float) -> Comparison:  # fmt: skip
    """One value a side and no noise (sim mode): any change past `tolerance` is a verdict."""
    if math.isnan(baseline) or math.isnan(current):  # a figure that appeared or vanished
        same = math.isnan(baseline) and math.isnan(current)
        change, worse = (0.0, 0.0) if same else (math.nan, math.inf)
    else:  # floored at a tiny value as the bootstrap's logs are: a 0 capacity is "much worse"
        change = math.expm1(math.log(max(current, 1e-9)) - math.log(max(baseline, 1e-9)))
        worse = -change if higher_is_better else change
    return Comparison(figure, baseline, current, worse, worse, worse, change, change, change,
                      tolerance, _verdict(worse, worse, tolerance))  # fmt: skip


def _verdict(worse_lo: float, worse_hi: float, tolerance: float) -> Verdict:
    """Worse beyond the tolerance even at its best, better beyond it even at its worst."""
    if worse_lo > tolerance:
        return Verdict.REGRESSION
    if worse_hi < -tolerance:
        return Verdict.IMPROVEMENT
    return Verdict.OK


def parse_tolerance(text: str) -> float:
    """'5%' or '0.05' -> 0.05; anything else is a one-line error naming the value."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100.0 if raw.endswith("%") else float(raw)
    except ValueError:
        raise TuneError(f"--tolerance {text!r} is not a number; write it like 5% or 0.05") from None
    if not 0.0 <= value < 1.0:
        raise TuneError(f"--tolerance {text!r} is out of range; use 0% to 99%, e.g. 5%")
    return value
