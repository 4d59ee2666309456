"""The regression verdict: quiet on noise, loud on a real slowdown, correct in direction."""

import numpy as np
import pytest

from tuner.bench.stats import Verdict, compare_figure, parse_tolerance
from tuner.errors import TuneError


def _noisy(center: float, n: int, noise: float, seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    return list(center * (1.0 + rng.normal(0.0, noise, size=n)))


def test_same_distribution_is_never_called_a_regression():
    alarms = 0
    for seed in range(50):
        base = _noisy(10.0, 5, 0.04, seed)
        cur = _noisy(10.0, 5, 0.04, seed + 1000)
        cmp_ = compare_figure("capacity_rps", base, cur, higher_is_better=True, tolerance=0.05)
        alarms += cmp_.verdict is Verdict.REGRESSION
    assert alarms == 0


def test_twenty_percent_capacity_drop_is_caught():
    for seed in range(20):
        base = _noisy(10.0, 5, 0.04, seed)
        cur = _noisy(8.0, 5, 0.04, seed + 1000)
        cmp_ = compare_figure("capacity_rps", base, cur, higher_is_better=True, tolerance=0.05)
        assert cmp_.verdict is Verdict.REGRESSION
        assert 0.12 < cmp_.worse_frac < 0.28


def test_latency_direction_is_respected():
    rise = compare_figure(
        "tpot_p99_ms", [20, 20.5, 19.8], [30, 30.2, 29.9], higher_is_better=False, tolerance=0.05
    )
    drop = compare_figure(
        "tpot_p99_ms", [30, 30.2, 29.9], [20, 20.5, 19.8], higher_is_better=False, tolerance=0.05
    )
    assert rise.verdict is Verdict.REGRESSION
    assert drop.verdict is Verdict.IMPROVEMENT


def test_noise_floor_stops_single_samples_from_alarming():
    cmp_ = compare_figure(
        "capacity_rps", [10.0], [9.0], higher_is_better=True, tolerance=0.05, min_noise_frac=0.1
    )
    assert cmp_.verdict is Verdict.OK


def test_zero_capacity_reads_as_much_worse_not_a_crash():
    cmp_ = compare_figure(
        "capacity_rps", [4.0, 4.1], [0.0, 0.0], higher_is_better=True, tolerance=0.05
    )
    assert cmp_.verdict is Verdict.REGRESSION


@pytest.mark.parametrize(("text", "value"), [("5%", 0.05), ("0.1", 0.1), (" 12.5% ", 0.125)])
def test_tolerance_parses(text, value):
    assert parse_tolerance(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["five", "150%", "-1%"])
def test_bad_tolerance_is_a_one_line_error(text):
    with pytest.raises(TuneError, match="tolerance"):
        parse_tolerance(text)
