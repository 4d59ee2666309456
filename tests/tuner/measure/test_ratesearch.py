"""The pure capacity search: brackets, bisects, and stops where it should."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tuner.errors import TuneError
from tuner.measure.ratesearch import Outcome, RateSearch, RateSearchSettings


def run(search: RateSearch, capacity: float) -> list[float]:
    """Drive a search against a config whose true capacity is `capacity`."""
    rates = []
    while (rate := search.next_rate()) is not None:
        rates.append(rate)
        search.record(rate, rate <= capacity)
    return rates


@given(
    capacity=st.floats(0.2, 200.0),
    start=st.floats(0.1, 300.0),
    growth=st.sampled_from([1.5, 2.0]),
    tol=st.sampled_from([0.05, 0.1, 0.25]),
)
def test_converges_to_a_bracket_around_the_true_capacity(capacity, start, growth, tol):
    search = RateSearch(RateSearchSettings(start, growth=growth, rel_tol=tol, max_levels=40))
    run(search, capacity)
    assert search.outcome is Outcome.CONVERGED
    assert search.capacity_rps <= capacity < search.upper_bound_rps
    assert search.upper_bound_rps / search.capacity_rps - 1 <= tol


def test_failing_at_the_start_bounds_capacity_below_it_after_one_level():
    # What the pruner reads: one failed level at the best capacity so far is a bound below it.
    search = RateSearch(RateSearchSettings(4.0))
    search.record(4.0, False)
    assert search.capacity_rps == 0.0 and search.upper_bound_rps == 4.0
    assert not search.done and search.next_rate() == 2.0


def test_passing_at_the_best_so_far_climbs_then_bisects():
    search = RateSearch(RateSearchSettings(4.0, growth=1.5, rel_tol=0.1))
    rates = run(search, capacity=7.0)
    assert rates[:3] == [4.0, 6.0, 9.0]
    assert 6.0 <= search.capacity_rps <= 7.0 < search.upper_bound_rps


def test_a_config_that_never_passes_stops_at_the_minimum_rate():
    search = RateSearch(RateSearchSettings(1.0, min_rps=0.1, max_levels=20))
    rates = run(search, capacity=0.01)
    assert search.outcome is Outcome.BELOW_MIN
    assert min(rates) == pytest.approx(0.1) and search.capacity_rps == 0.0


def test_level_limit_and_max_rate_end_the_search():
    limited = RateSearch(RateSearchSettings(1.0, max_levels=3))
    assert len(run(limited, capacity=100.0)) == 3
    assert limited.outcome is Outcome.MAX_LEVELS and limited.capacity_rps == 4.0
    capped = RateSearch(RateSearchSettings(1.0, max_rps=5.0, max_levels=10))
    run(capped, capacity=100.0)
    assert capped.outcome is Outcome.AT_MAX and capped.capacity_rps == 5.0


def test_noise_above_a_failure_does_not_count_as_capacity():
    search = RateSearch(RateSearchSettings(2.0))
    search.record(2.0, True)
    search.record(4.0, False)
    search.record(3.0, False)
    assert search.capacity_rps == 2.0 and search.upper_bound_rps == 3.0
    assert math.isclose(search.next_rate(), math.sqrt(6.0))


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [({"start_rps": 0}, "start_rps=0"), ({"start_rps": 1, "growth": 1.0}, "growth=1.0")],
)
def test_bad_settings_name_the_value(kwargs, named):
    with pytest.raises(TuneError, match=named):
        RateSearchSettings(**kwargs)
